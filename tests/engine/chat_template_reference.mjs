// Renders every case of tests/data/chat_templates/cases.json with
// @huggingface/jinja (the JavaScript Jinja of transformers.js), the
// independent reference for engine/text/chat_template.cc:
//   node chat_template_reference.mjs CASES_JSON TEMPLATE_DIR OUT_JSON
// OUT_JSON maps each case name to {"output": TEXT} or {"error": MESSAGE}.
import { readFileSync, writeFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";

const [casesPath, templateDir, outPath] = process.argv.slice(2);
const { cases } = JSON.parse(readFileSync(casesPath, "utf8"));
const parsed = new Map();
const out = {};
for (const c of cases) {
  try {
    if (!parsed.has(c.template)) {
      parsed.set(c.template, new Template(readFileSync(`${templateDir}/${c.template}`, "utf8")));
    }
    out[c.name] = { output: parsed.get(c.template).render(c.vars) };
  } catch (e) {
    out[c.name] = { error: String(e.message || e) };
  }
}
writeFileSync(outPath, JSON.stringify(out, null, 1) + "\n");
console.log(`rendered ${cases.length} cases`);
