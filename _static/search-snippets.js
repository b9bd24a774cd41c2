/* attnbook: search result snippets without raw LaTeX.
 *
 * Sphinx builds each snippet from the page's HTML text, where math is still MathJax source
 * ("\(d_k\)", "\begin{split}..."). This wraps Search.htmlToText so that inline math reads as
 * plain symbols (d_k, √, ᵀ, α ...) and display math is shown as "[公式]".
 */
(function () {
  "use strict";
  var SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", eta: "η",
    theta: "θ", lambda: "λ", mu: "μ", pi: "π", rho: "ρ", sigma: "σ", tau: "τ", phi: "φ",
    varphi: "φ", omega: "ω", Delta: "Δ", Sigma: "Σ", Omega: "Ω", sqrt: "√", top: "ᵀ",
    times: "×", cdot: "·", cdots: "⋯", ldots: "…", dots: "…", le: "≤", leq: "≤", ge: "≥",
    geq: "≥", ne: "≠", neq: "≠", approx: "≈", in: "∈", infty: "∞", sum: "∑", prod: "∏",
    to: "→", rightarrow: "→", partial: "∂", nabla: "∇", odot: "⊙", otimes: "⊗", mathbb: "",
  };

  function plainTex(tex) {
    return tex
      .replace(/^\s*\\\(|\\\)\s*$/g, "")
      .replace(/\\(?:text|mathrm|mathbf|operatorname|boldsymbol|mathcal|mathit)\s*\{([^{}]*)\}/g, "$1")
      .replace(/\\([A-Za-z]+)/g, function (_, name) {
        return Object.prototype.hasOwnProperty.call(SYMBOLS, name) ? SYMBOLS[name] : "";
      })
      .replace(/\\[,;:!> ]/g, " ")
      .replace(/[{}]/g, "")
      .replace(/\s+/g, " ")
      .trim();
  }

  function patch() {
    if (typeof Search === "undefined" || !Search.htmlToText || Search._attnbookPatched) return;
    var original = Search.htmlToText;
    Search.htmlToText = function (htmlString, anchor) {
      var doc = new DOMParser().parseFromString(htmlString, "text/html");
      doc.querySelectorAll("div.math").forEach(function (el) {
        el.replaceWith(doc.createTextNode(" [公式] "));
      });
      doc.querySelectorAll("span.math").forEach(function (el) {
        el.replaceWith(doc.createTextNode(plainTex(el.textContent)));
      });
      return original(doc.documentElement.outerHTML, anchor);
    };
    Search._attnbookPatched = true;
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", patch);
  } else {
    patch();
  }
})();
