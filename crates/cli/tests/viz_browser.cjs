// Drives `minfer viz` in a real headless Chromium through playwright-core and prints
// one JSON line of what it measured. Run by tests/viz.rs; see there for the contract.
//   VIZ_URL     the page
//   VIZ_SHOT    where to save a screenshot
//   VIZ_MODE    "full" (run, click, step) or "layout" (layout times of a large graph)
//   CHROMIUM    the browser binary (default /usr/bin/chromium)
"use strict";
const { chromium } = require("playwright-core");

const url = process.env.VIZ_URL;
const shot = process.env.VIZ_SHOT;
const mode = process.env.VIZ_MODE || "full";

async function waitDone(page) {
  await page.waitForFunction(() => document.getElementById("runStatus").dataset.done === "1", null, { timeout: 60000 });
}

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu"],
  });
  const out = { mode };
  try {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    const t0 = Date.now();
    await page.goto(url);
    await page.waitForFunction(() => window.viz && window.viz.ready, null, { timeout: 30000 });
    out.loadMs = Date.now() - t0;
    const graph = await page.evaluate(async () => (await fetch("/viz/graph")).json());
    out.graphNodes = graph.nodes.length;
    out.shownNodes = Number(await page.getAttribute("#counts", "data-nodes"));
    out.initialLayoutMs = await page.evaluate(() => window.viz.layoutMs);
    out.initialBoxes = await page.locator("g.node").count();
    if (mode === "layout") {
      let t = Date.now();
      await page.click("#expandAll");
      out.expandClickMs = Date.now() - t;
      out.expandedLayoutMs = await page.evaluate(() => window.viz.layoutMs);
      out.expandedBoxes = await page.locator("g.node[data-id]").count();
      // A prompt of several tokens, so that the run has a prefill graph of its own.
      await page.fill("#prompt", "def fibonacci(n):");
      await page.fill("#ntok", "2");
      await page.click("#run");
      await waitDone(page);
      t = Date.now();
      await page.evaluate(() => 1);
      out.responsiveMs = Date.now() - t;
      await page.selectOption("#phase", "0");
      out.prefillNodes = await page.evaluate(() => window.viz.graph.nodes.length);
      out.prefillLayoutMs = await page.evaluate(() => window.viz.layoutMs);
      out.prefillBoxes = await page.locator("g.node[data-id]").count();
    } else {
      out.dataIdBoxes = await page.locator("g.node[data-id]").count();
      await page.fill("#prompt", "Hello world");
      await page.fill("#ntok", "4");
      await page.click("#run");
      await waitDone(page);
      out.runStatus = await page.textContent("#runStatus");
      out.events = await page.evaluate(() => window.viz.events);
      out.phases = await page.evaluate(() => window.viz.trace.phases.map((p) => [p.kind, p.steps.length, p.steps.map((s) => s.nodes.length)]));
      // A node of the decode graph the page now follows.
      const id = await page.evaluate(() => window.viz.graph.nodes.find((n) => n.name === "attn_norm-0").id);
      await page.locator(`g.node[data-id="${id}"]`).click({ force: true });
      const stats = async () => page.evaluate(() => {
        const cells = {};
        for (const c of document.querySelectorAll("#nodeStats td[data-stat]")) cells[c.dataset.stat] = c.textContent;
        return {
          title: document.querySelector("#details h3").textContent,
          label: document.getElementById("stepLabel").textContent,
          phase: Number(document.getElementById("stepLabel").dataset.phase),
          step: Number(document.getElementById("stepLabel").dataset.step),
          cells,
          info: document.getElementById("nodeInfo").textContent,
          bars: document.querySelectorAll("#histogram rect").length,
        };
      });
      out.last = await stats();
      // Back to the prefill step, then one step forward: the next token's values.
      const flat = await page.evaluate(() => window.viz.trace.phases.reduce((a, p) => a + p.steps.length, 0));
      for (let i = 0; i < flat; i++) await page.click("#prev");
      out.first = await stats();
      await page.click("#next");
      out.second = await stats();
    }
    out.errors = errors;
    if (shot) await page.screenshot({ path: shot });
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
