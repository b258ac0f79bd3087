// pymdownx.arithmatex (generic) marks \( \) and \[ \]; MathJax renders them (mkdocs-material's recipe).
window.MathJax = {
  tex: {inlineMath: [["\\(", "\\)"]], displayMath: [["\\[", "\\]"]], processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"}
};
document$.subscribe(() => { MathJax.typesetPromise && MathJax.typesetPromise(); });
