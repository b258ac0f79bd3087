// pymdownx.arithmatex (generic) marks \( \) and \[ \]; KaTeX, served with the site, renders them on every
// page Material loads (its instant navigation included).
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    throwOnError: false,
  });
});
