"""Checks of deploy/: every Kubernetes manifest parses and hangs together (selectors, probes,
ports, volumes, resources, non-root), the configurations inside them load with conveyor's own
loader, kustomize renders both variants (when kubectl is installed; it works offline), and
the systemd unit passes systemd-analyze verify (when installed)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

SOURCE = os.environ["CONVEYOR_SOURCE_DIR"]
BUILD = os.path.abspath(os.environ["CONVEYOR_BUILD_DIR"])
K8S = os.path.join(SOURCE, "deploy", "kubernetes")
CONVEYOR = os.path.join(BUILD, "client", "conveyor")
CONVEYORD = os.path.join(BUILD, "server", "conveyord")


def manifests():
    """(file, document) for every YAML document under deploy/kubernetes."""
    out = []
    for dirpath, _, files in os.walk(K8S):
        for f in sorted(files):
            if f.endswith(".yaml"):
                path = os.path.join(dirpath, f)
                with open(path) as fh:
                    for doc in yaml.safe_load_all(fh):
                        if doc is not None:
                            out.append((os.path.relpath(path, K8S), doc))
    return out


def workloads():
    return [(f, d) for f, d in manifests() if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


def generated_config_maps(kustomization):
    """ConfigMaps a kustomization's configMapGenerator makes: name -> {key: text}."""
    out = {}
    for gen in kustomization.get("configMapGenerator", []):
        data = {}
        for literal in gen.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        out[gen["name"]] = data
    return out


def all_config_maps():
    maps = {d["metadata"]["name"]: d["data"] for _, d in manifests() if d["kind"] == "ConfigMap"}
    for f, d in manifests():
        if d.get("kind") == "Kustomization":
            maps.update(generated_config_maps(d))
    return maps


class ManifestTest(unittest.TestCase):
    def test_every_document_is_a_named_kubernetes_object(self):
        docs = manifests()
        self.assertGreaterEqual(len(docs), 8)
        for f, d in docs:
            self.assertIn("apiVersion", d, f)
            self.assertIn("kind", d, f)
            if d["kind"] != "Kustomization":
                self.assertTrue(d["metadata"]["name"], f)
        kinds = {d["kind"] for _, d in docs}
        for kind in ("Deployment", "DaemonSet", "Service", "PodDisruptionBudget", "ConfigMap", "Kustomization"):
            self.assertIn(kind, kinds)

    def test_kustomizations_list_files_that_exist(self):
        for f, d in manifests():
            if d["kind"] != "Kustomization":
                continue
            base = os.path.dirname(os.path.join(K8S, f))
            for r in d.get("resources", []):
                self.assertTrue(os.path.exists(os.path.join(base, r)), f"{f}: {r}")

    def test_workloads_are_probed_bounded_and_non_root(self):
        self.assertEqual(len(workloads()), 2)
        for f, d in workloads():
            spec = d["spec"]
            template = spec["template"]
            labels = template["metadata"]["labels"]
            for k, v in spec["selector"]["matchLabels"].items():
                self.assertEqual(labels.get(k), v, f"{f}: selector {k} does not match the pod labels")
            pod = template["spec"]
            self.assertTrue(pod["securityContext"]["runAsNonRoot"], f)
            self.assertEqual(pod["securityContext"]["runAsUser"], 10001, f)  # the image's user
            self.assertGreaterEqual(pod["terminationGracePeriodSeconds"], 30, f"{f}: room to drain")
            volumes = {v["name"]: v for v in pod["volumes"]}
            for c in pod["containers"]:
                where = f"{f}: container {c['name']}"
                self.assertIn("cpu", c["resources"]["requests"], where)
                self.assertIn("memory", c["resources"]["requests"], where)
                self.assertFalse(c["securityContext"]["allowPrivilegeEscalation"], where)
                self.assertTrue(c["securityContext"]["readOnlyRootFilesystem"], where)
                args = c["args"]
                socket = args[args.index("--unix") + 1]
                self.assertTrue(args[0].startswith("/config/"), where)
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    cmd = c[probe]["exec"]["command"]
                    self.assertEqual(cmd[:2], ["/opt/conveyor/bin/conveyor", "health"], f"{where} {probe}")
                    self.assertEqual(cmd[-1], "unix:" + socket, f"{where} {probe} must probe the daemon's socket")
                mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
                for m in c["volumeMounts"]:
                    self.assertIn(m["name"], volumes, f"{where}: mount of an undefined volume {m['name']}")
                self.assertEqual(os.path.dirname(socket), [p for p in mounts if socket.startswith(p + "/")][0],
                                 f"{where}: the socket directory must be a volume (writable, shareable)")
                self.assertIn("/config", mounts, where)

    def test_tcp_beyond_loopback_always_has_a_token(self):
        """conveyord refuses a non-loopback address without a token: every workload that
        listens beyond loopback names a token file (flag or its config's tokenFile)."""
        maps = all_config_maps()
        for f, d in workloads():
            pod = d["spec"]["template"]["spec"]
            config_maps = [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v]
            for c in pod["containers"]:
                args = c["args"]
                listen = args[args.index("--listen") + 1]
                if listen.startswith("127.") or listen.startswith("localhost:"):
                    continue
                config = yaml.safe_load(maps[config_maps[0]]["conveyor.yaml"])
                self.assertTrue("--token-file" in args or config.get("tokenFile"),
                                f"{f}: {listen} without a token would not start")

    def test_the_node_local_socket_admits_the_daemons_group(self):
        """Trainer pods reach the node-local daemon as group 10001: the socket must be 0660."""
        for f, d in workloads():
            if d["kind"] != "DaemonSet":
                continue
            args = d["spec"]["template"]["spec"]["containers"][0]["args"]
            self.assertEqual(args[args.index("--unix-mode") + 1], "0660", f)

    def test_config_maps_referenced_exist_and_hold_the_config(self):
        maps = all_config_maps()
        for f, d in workloads():
            for v in d["spec"]["template"]["spec"]["volumes"]:
                if "configMap" in v:
                    self.assertIn(v["configMap"]["name"], maps, f)
                    self.assertIn("conveyor.yaml", maps[v["configMap"]["name"]], f)

    def test_services_and_budget_select_the_replicas(self):
        deployment = [d for _, d in workloads() if d["kind"] == "Deployment"][0]
        pod = deployment["spec"]["template"]
        port_names = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
        services = [d for _, d in manifests() if d["kind"] == "Service"]
        self.assertEqual(len(services), 2)
        self.assertIn("None", [str(s["spec"].get("clusterIP")) for s in services])  # headless: one record per replica
        for s in services + [d for _, d in manifests() if d["kind"] == "PodDisruptionBudget"]:
            selector = s["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            for k, v in selector.items():
                self.assertEqual(pod["metadata"]["labels"].get(k), v, s["metadata"]["name"])
            for p in s["spec"].get("ports", []):
                self.assertIn(p["targetPort"], port_names, s["metadata"]["name"])

    def test_the_configurations_inside_load_with_conveyor(self):
        """Each ConfigMap's conveyor.yaml, with /data and the secrets mapped to files made
        here, passes `conveyor inspect` (so every key in it is one conveyor knows)."""
        maps = all_config_maps()
        self.assertGreaterEqual(len(maps), 2)
        for name, data in maps.items():
            with tempfile.TemporaryDirectory() as tmp:
                os.makedirs(os.path.join(tmp, "data"))
                with open(os.path.join(tmp, "data", "train.ctf"), "w") as f:
                    f.write("|features " + " ".join(["0.5"] * 784) + " |labels 3:1\n")
                text = data["conveyor.yaml"].replace("/data/", tmp + "/data/").replace("/etc/conveyor/", tmp + "/etc/")
                config = os.path.join(tmp, "conveyor.yaml")
                with open(config, "w") as f:
                    f.write(text)
                r = subprocess.run([CONVEYOR, "inspect", config], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, f"{name}: {r.stderr}")
                self.assertIn("samples       1", r.stdout)
                self.assertNotIn("WARNING", r.stderr, f"{name}: {r.stderr}")

    @unittest.skipUnless(shutil.which("kubectl"), "kubectl is not installed")
    def test_kustomize_renders_both_variants(self):
        for sub in ("", "node-local"):
            r = subprocess.run(["kubectl", "kustomize", os.path.join(K8S, sub)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout) if d]
            self.assertIn("DaemonSet" if sub else "Deployment", kinds)
            self.assertIn("ConfigMap", kinds)


class SystemdTest(unittest.TestCase):
    UNIT = os.path.join(SOURCE, "deploy", "systemd", "conveyord.service")
    CONFIG = os.path.join(SOURCE, "deploy", "systemd", "conveyor.yaml")

    def test_the_shipped_configuration_loads_and_stays_on_loopback(self):
        """/etc/conveyor/conveyor.yaml as the .deb installs it (examples under share/)."""
        with open(self.CONFIG) as f:
            text = f.read().replace("/usr/local/share/conveyor/examples/", os.path.join(SOURCE, "examples") + "/")
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "conveyor.yaml")
            with open(config, "w") as f:
                f.write(text)
            r = subprocess.run([CONVEYOR, "inspect", config], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(yaml.safe_load(text)["listen"].startswith("127.0.0.1:"))

    def test_unit_is_hardened(self):
        with open(self.UNIT) as f:
            text = f.read()
        for line in ("DynamicUser=yes", "ProtectSystem=strict", "ReadOnlyPaths=", "NoNewPrivileges=yes",
                     "KillSignal=SIGTERM", "RuntimeDirectory=conveyor", "CapabilityBoundingSet="):
            self.assertIn(line, text)

    @unittest.skipUnless(shutil.which("systemd-analyze"), "systemd-analyze is not installed")
    def test_systemd_analyze_verifies_the_unit(self):
        with open(self.UNIT) as f:
            text = f.read().replace("/usr/local/bin/conveyord", CONVEYORD)
        with tempfile.TemporaryDirectory() as tmp:
            unit = os.path.join(tmp, "conveyord.service")
            with open(unit, "w") as f:
                f.write(text)
            r = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(r.stderr.strip(), "", r.stderr)


if __name__ == "__main__":
    unittest.main()
