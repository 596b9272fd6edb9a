// MathJax set-up for pymdownx.arithmatex (generic mode): \( \) inline, \[ \] display.
// The script itself (js/mathjax/tex-svg.js) is served from the site: tools/mkdocs_mathjax.py.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};

document$.subscribe(() => {
  if (MathJax.startup.output.clearCache) MathJax.startup.output.clearCache();
  MathJax.typesetClear();
  MathJax.texReset();
  MathJax.typesetPromise();
});
