// Typesets the formulas of a page with the vendored KaTeX (docs/vendor/katex), offline.
// pymdownx.arithmatex (generic mode, mkdocs.yml) writes inline math as
// <span class="arithmatex">\(...\)</span> and display math as <div class="arithmatex">\[...\]</div>.
(function () {
  "use strict";

  function strip(text) {
    var t = text.trim();
    if ((t.startsWith("\\(") && t.endsWith("\\)")) || (t.startsWith("\\[") && t.endsWith("\\]"))) {
      return t.slice(2, -2);
    }
    return t;
  }

  function render(root) {
    if (typeof katex === "undefined") {
      return;
    }
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (el.dataset.katexDone) {
        return;
      }
      var tex = strip(el.textContent);
      try {
        katex.render(tex, el, {
          displayMode: el.tagName === "DIV",
          throwOnError: false, // a typo shows the source in red, the rest of the page renders
          output: "htmlAndMathml", // MathML for screen readers
        });
      } catch (err) {
        el.title = String(err);
      }
      el.dataset.katexDone = "1";
    });
  }

  if (typeof document$ !== "undefined") {
    // Material's observable of page loads (also fires on instant navigation)
    document$.subscribe(function () {
      render(document.body);
    });
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () {
      render(document.body);
    });
  } else {
    render(document.body);
  }
})();
