"""cluster/: the RayService manifest is generated from the Serve config, is current, and is a
valid KubeRay RayService (checked against the CRD's OpenAPI schema, since no API server runs here).

The CRD: shared/kuberay/ beside the checkout (``../shared``) or inside it (``shared/``), else the
repository's gzipped copy in cluster/crd/ (so the test never skips for want of it).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SERVE_CONFIG = REPO / "serve_configs" / "qwen3_omni.yaml"
MANIFEST = REPO / "cluster" / "rayservice-qwen3-omni.yaml"
CRD_NAME = "kuberay/ray.io_rayservices.yaml"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 1 MB of YAML


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "generate_rayservice", REPO / "cluster" / "generate_rayservice.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


generator = _load_generator()


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


# -- generated, current, and carrying the Serve config ------------------------------------------
def test_committed_manifest_is_current():
    assert MANIFEST.read_text() == generator.render(), (
        "cluster/rayservice-qwen3-omni.yaml is stale: run `python cluster/generate_rayservice.py`")


def test_check_mode(tmp_path, capsys):
    assert generator.main(["--check"]) == 0
    stale = tmp_path / "rayservice.yaml"
    stale.write_text(MANIFEST.read_text().replace("chunk_frames: 25", "chunk_frames: 50"))
    assert generator.main(["--check", "--out", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err
    assert generator.main(["--check", "--out", str(tmp_path / "missing.yaml")]) == 1


def test_serve_config_v2_is_the_serve_config(manifest):
    embedded = manifest["spec"]["serveConfigV2"]
    assert isinstance(embedded, str)  # KubeRay wants the Serve YAML as a string
    assert embedded == SERVE_CONFIG.read_text()  # verbatim, comments included
    assert yaml.safe_load(embedded) == yaml.safe_load(SERVE_CONFIG.read_text())


def test_generation_follows_the_serve_config(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE_CONFIG.read_text().replace("num_replicas: 2", "num_replicas: 3"))
    out = tmp_path / "rayservice.yaml"
    assert generator.main(["--serve-config", str(config), "--out", str(out)]) == 0
    embedded = yaml.safe_load(yaml.safe_load(out.read_text())["spec"]["serveConfigV2"])
    assert embedded["applications"][0]["args"]["talker"]["deployment_config"]["num_replicas"] == 3


def test_generator_rejects_a_non_serve_config(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("model: tiny\n")
    with pytest.raises(ValueError, match="not a Serve config"):
        generator.render(config)


# -- valid against KubeRay's RayService CRD ------------------------------------------------------
def _shared_dir() -> Path | None:
    for candidate in (REPO.parent / "shared", REPO / "shared"):
        if (candidate / CRD_NAME).is_file():
            return candidate
    return None


def crd_to_json_schema(node: dict) -> dict:
    """One OpenAPI v3 schema node of a CRD as JSON Schema (draft 7), with Kubernetes' semantics.

    * ``x-kubernetes-*`` keys are dropped (CEL rules and list/map kinds need an API server);
      ``x-kubernetes-int-or-string`` already comes with its ``anyOf: [integer, string]``.
    * ``nullable: true`` admits null.
    * An object with ``properties`` and no ``additionalProperties`` or
      ``x-kubernetes-preserve-unknown-fields`` rejects other keys, as the API server does for a
      structural schema under ``kubectl apply``'s strict field validation (a misspelt field
      fails instead of silently vanishing).
    """
    out: dict = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key == "nullable":
            continue
        if key == "properties":
            out[key] = {name: crd_to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = crd_to_json_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [crd_to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in out and "additionalProperties" not in out
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


VENDORED_CRD = REPO / "cluster" / "crd" / "ray.io_rayservices.yaml.gz"  # cluster/crd/README.md


def _crd_text() -> str:
    """The RayService CRD: shared/ beside (or in) the checkout when there, else the repo's copy."""
    shared = _shared_dir()
    if shared is not None:
        return (shared / CRD_NAME).read_text()
    import gzip

    return gzip.decompress(VENDORED_CRD.read_bytes()).decode()


@pytest.fixture(scope="module")
def rayservice_validator():
    import jsonschema

    crd = yaml.load(_crd_text(), Loader=_Loader)
    assert crd["spec"]["names"]["kind"] == "RayService"
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = crd_to_json_schema(v1["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(validator, document) -> list[str]:
    return ["/".join(map(str, e.absolute_path)) + ": " + e.message
            for e in validator.iter_errors(document)]


def test_manifest_validates_against_crd(rayservice_validator, manifest):
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    assert _errors(rayservice_validator, manifest) == []


@pytest.mark.parametrize("mutate, field", [
    # rayStartParams values are strings: an unquoted number is the classic mistake.
    (lambda m: m["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]
     .__setitem__("num-gpus", 0), "rayStartParams/num-gpus"),
    (lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
     .__setitem__("replicas", "one"), "workerGroupSpecs/0/replicas"),
    # serveConfigV2 is a string, not the Serve config's mapping.
    (lambda m: m["spec"].__setitem__("serveConfigV2", yaml.safe_load(m["spec"]["serveConfigV2"])),
     "spec/serveConfigV2"),
    (lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][1]
     .__setitem__("maxReplica", 8), "workerGroupSpecs/1"),  # misspelt field
    (lambda m: m["spec"]["rayClusterConfig"]["workerGroupSpecs"][1].pop("groupName"),
     "workerGroupSpecs/1"),  # required field
], ids=["int-start-param", "string-replicas", "mapping-serve-config", "unknown-field",
        "missing-group-name"])
def test_wrong_manifest_fails_validation(rayservice_validator, manifest, mutate, field):
    bad = copy.deepcopy(manifest)
    mutate(bad)
    errors = _errors(rayservice_validator, bad)
    assert errors and any(field in e for e in errors), errors


# -- the cluster fits the Serve config -----------------------------------------------------------
def _groups(manifest) -> dict[str, dict]:
    cluster = manifest["spec"]["rayClusterConfig"]
    return {"head": cluster["headGroupSpec"],
            **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}


def _containers(group) -> list[dict]:
    return group["template"]["spec"]["containers"]


def _gpus_per_pod(group) -> float:
    return sum(float(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
               for c in _containers(group))


def _custom_resources(group) -> dict[str, float]:
    # KubeRay's syntax: resources: '"{\"name\": 1}"' (a JSON string holding a JSON object).
    raw = group.get("rayStartParams", {}).get("resources")
    return json.loads(json.loads(raw)) if raw else {}


def _serve_args() -> dict:
    return yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"]


def test_head_has_no_gpu(manifest):
    head = _groups(manifest)["head"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert _gpus_per_pod(head) == 0
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0"


def test_stages_fit_their_worker_groups(manifest):
    """Each custom resource a stage asks for is offered by one GPU group, big enough for the
    configured replicas, with one GPU per unit (so GPU and pinning resource run out together)."""
    groups = _groups(manifest)
    offered = {name: _custom_resources(g) for name, g in groups.items() if _custom_resources(g)}
    demand: dict[str, float] = {}
    for stage in ("thinker", "talker", "code2wav"):
        cfg = _serve_args()[stage]
        res = cfg["engine_resources"]
        replicas = cfg["deployment_config"].get("num_replicas", 1)
        (resource, amount), = res["resources"].items()  # one pinning resource per stage
        owners = [g for g, r in offered.items() if resource in r]
        assert len(owners) == 1, f"{stage}: resource {resource!r} offered by {owners}"
        group = groups[owners[0]]
        assert res["num_gpus"] / amount == _gpus_per_pod(group) / offered[owners[0]][resource]
        demand[owners[0]] = demand.get(owners[0], 0) + replicas * res["num_gpus"]
    for name, gpus in demand.items():
        group = groups[name]
        assert gpus <= group["replicas"] * _gpus_per_pod(group), f"{name}: {gpus} GPUs needed"
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_pods_share_image_model_volume_and_api_keys(manifest):
    model = Path(_serve_args()["model"])
    for name, group in _groups(manifest).items():
        for container in _containers(group):
            assert container["image"] == "omni-ray:0.1.0-cu130", name
            # The head builds the app (validation checks the checkpoint exists); workers load it.
            mounts = [Path(m["mountPath"]) for m in container.get("volumeMounts", [])]
            assert any(model.is_relative_to(m) for m in mounts), f"{name}: {model} not mounted"
            # The ingress replica may land on any pod, so every pod gets the keys' env var.
            env = {e["name"]: e for e in container.get("env", [])}
            assert "secretKeyRef" in env["OMNI_RAY_API_KEYS"]["valueFrom"], name


# -- the weights Job fills what the RayService mounts ---------------------------------------------
def _weights_docs() -> dict[str, dict]:
    docs = yaml.safe_load_all((REPO / "cluster" / "weights-job.yaml").read_text())
    return {d["kind"]: d for d in docs}


def test_weights_job_fills_the_mounted_model_dir(manifest):
    docs = _weights_docs()
    job, pvc = docs["Job"], docs["PersistentVolumeClaim"]
    assert job["apiVersion"] == "batch/v1" and pvc["apiVersion"] == "v1"
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    (container,) = pod["containers"]
    cmd = container["command"]
    assert cmd[:3] == ["hf", "download", "Qwen/Qwen3-Omni-30B-A3B-Instruct"]
    local_dir = cmd[cmd.index("--local-dir") + 1]
    assert local_dir == yaml.safe_load(SERVE_CONFIG.read_text())["applications"][0]["args"]["model"]
    (mount,) = container["volumeMounts"]
    assert local_dir.startswith(mount["mountPath"] + "/") and not mount.get("readOnly")
    (vol,) = pod["volumes"]
    claim = vol["persistentVolumeClaim"]["claimName"]
    assert claim == pvc["metadata"]["name"]
    ray_claims = {v["persistentVolumeClaim"]["claimName"]
                  for g in _groups(manifest).values()
                  for v in g["template"]["spec"].get("volumes", []) if "persistentVolumeClaim" in v}
    assert ray_claims == {claim}  # the volume every Ray pod mounts


def test_weights_job_pod_is_a_valid_pod_template(rayservice_validator, manifest):
    """The Job's pod template, put in place of the head's, validates against the RayService
    CRD (which embeds Kubernetes' PodTemplateSpec schema)."""
    doc = copy.deepcopy(manifest)
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]
    head["template"] = copy.deepcopy(_weights_docs()["Job"]["spec"]["template"])
    assert _errors(rayservice_validator, doc) == []
    head["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountpath"] = "/x"
    assert _errors(rayservice_validator, doc)  # a misspelt field is caught
