/* One collapsed bar of code per section.  Each collapsed code cell (tag hide-input) has its own "Show code
   cell source" bar; here a section's collapsed cells open and close together from the first one's bar, which
   says how many it holds, and the others lose theirs (their outputs stay in place).  Jupyter Book adds every
   .js of _static/ to each page; tests/browser counts the bars a section shows. */
document.addEventListener("DOMContentLoaded", () => {
  for (const section of document.querySelectorAll("article section")) {
    const cells = [...section.querySelectorAll("details.hide.above-input")]
      .filter(d => d.closest("section") === section);
    if (cells.length < 2) continue;
    const [first, ...rest] = cells;
    rest.forEach(d => d.classList.add("folded-into-first"));
    const label = (cls, verb) => {
      const p = first.querySelector(`summary > p.${cls}`);
      if (p) p.textContent = `${verb} the code of this section (${cells.length} cells)`;
    };
    label("collapsed", "Show");
    label("expanded", "Hide");
    first.addEventListener("toggle", () => rest.forEach(d => { d.open = first.open; }));
  }
});
