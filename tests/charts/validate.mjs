// Validates Kubernetes objects (a JSON array on stdin) against the schemas
// of the npm packages kubernetes-models and @kubernetes-models/prometheus-operator.
// Prints one line per object; exits 1 if any object is invalid or of a kind
// it has no schema for.
import { readFileSync } from "node:fs";

const input = JSON.parse(readFileSync(0, "utf8"));
let failed = 0;
for (const obj of input) {
  const [group, version] = obj.apiVersion.includes("/")
    ? obj.apiVersion.split("/")
    : ["", obj.apiVersion];
  let mod;
  try {
    if (group === "monitoring.coreos.com") {
      mod = await import(`@kubernetes-models/prometheus-operator/monitoring.coreos.com/${version}`);
    } else {
      mod = await import(`kubernetes-models/${group ? group + "/" : ""}${version}`);
    }
  } catch (e) {
    console.log(`NO SCHEMA ${obj.apiVersion} ${obj.kind}`);
    failed++;
    continue;
  }
  const Kind = mod[obj.kind];
  if (!Kind) {
    console.log(`NO SCHEMA ${obj.apiVersion} ${obj.kind}`);
    failed++;
    continue;
  }
  try {
    new Kind(obj).validate();
    console.log(`ok ${obj.kind}/${obj.metadata.name}`);
  } catch (e) {
    console.log(`INVALID ${obj.kind}/${obj.metadata.name}: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
