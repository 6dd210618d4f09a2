"""The image without a container engine: the Dockerfile's stages and COPY sources, its two targets and the names
compose and the manifests build and run, and the final stages' shape (no compiler, no editable install, not
root). Building and running them with a real engine is `make image-test` (tests/integration/test_image.py)."""

from __future__ import annotations

import re
import subprocess

import yaml

from tests.image import ROOT, chain, copy_sources, stages

TARGETS = {"cpu", "cuda"}


def test_every_copy_names_a_source_that_exists_or_an_earlier_stage() -> None:
    seen: set[str] = set()
    for stage in stages():
        for rest in stage.args_of("COPY"):
            source_stage, paths = copy_sources(rest)
            if source_stage is not None:
                assert source_stage in seen, f"{stage.name}: COPY --from={source_stage} names no earlier stage"
                continue
            for path in paths:
                assert (ROOT / path).exists(), f"{stage.name}: COPY {path}: not in the repository"
        seen.add(stage.name)


def test_the_targets_are_cpu_and_cuda_cpu_builds_alone_and_is_the_default() -> None:
    all_stages = stages()
    names = [s.name for s in all_stages]
    assert set(names) >= TARGETS, names
    # A builder without BuildKit builds every stage before its target: nothing of CUDA's before the cpu one.
    assert names.index("cpu") < names.index("cuda"), names
    assert all_stages[-1].base == "cpu" and not all_stages[-1].instructions, "a build without --target gets the " \
                                                                              "last stage: the cpu image as it is"


def test_the_final_stages_have_no_compiler_no_editable_install_and_run_unprivileged() -> None:
    all_stages = stages()
    for target in TARGETS:
        built = chain(all_stages, target)
        runs = " ".join(a for s in built for a in s.args_of("RUN"))
        assert not re.search(r"\b(gcc|g\+\+|clang|build-essential)\b", runs), f"{target}: a compiler is installed"
        assert not re.search(r"pip install[^&;]*(\s-e\s|--editable)", runs), f"{target}: an editable install"
        user = built[0].args_of("USER")
        assert user and user[-1].split(":")[0] not in ("root", "0"), f"{target}: runs as {user or 'root'}"
        assert f"install.sh {target} " in runs, f"{target}: does not install through deploy/image/install.sh"
        args = {a.split("=", 1)[0] for s in built for a in s.args_of("ARG")}
        assert "PIP_INDEX_URL" in args and (target != "cpu" or "TORCH_CPU_INDEX" in args), \
            f"{target}: the install's choices are build arguments"
    builder = next(s for s in all_stages if s.name == "builder")
    assert "pip wheel" in " ".join(builder.args_of("RUN")), "the builder stage makes the wheel"


def test_compose_and_the_manifests_name_targets_the_dockerfile_has() -> None:
    names = {s.name for s in stages()}
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    built = {name: s["build"] for name, s in services.items() if "build" in s}
    assert built and all(isinstance(b, dict) and b["target"] in names for b in built.values()), built
    assert built["worker"]["target"] == "cpu" and built["worker-gpu"]["target"] == "cuda"
    assert services["worker-gpu"]["profiles"] == ["gpu"]
    # The manifests run images whose build command is written beside them.
    for path, target, tag in (("deploy/k8s/base/worker.yaml", "cpu", "stream-inference:0.1.0"),
                              ("deploy/k8s/gpu/kustomization.yaml", "cuda", "stream-inference:0.1.0-cuda")):
        text = (ROOT / path).read_text()
        assert f"docker build --target {target} -t {tag} ." in text, path
        assert re.search(rf"(image|value): {re.escape(tag)}\s", text), path
    for target in re.findall(r"--target (\w+)", (ROOT / "README.md").read_text()):
        assert target in names, f"README builds --target {target}"


def test_the_install_script_parses() -> None:
    subprocess.run(["sh", "-n", str(ROOT / "deploy" / "image" / "install.sh")], check=True)
