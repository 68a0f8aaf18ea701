"""The env layer's one parser of references, one name rule and one pin parser: every caller agrees on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hubgym.envs import EnvRef, env_name_problem, open_env, parse_pins, parse_ref, stored_env_verifier
from hubgym.errors import EnvContractError, EnvNotFoundError, VerifierNotTrustedError

ENVS = Path(__file__).parent / "broken_envs"
SHA = "9f" * 32


@pytest.mark.parametrize("text, expected", [
    ("arithmetic", EnvRef("arithmetic", "name", name="arithmetic")),
    ("arithmetic:easy", EnvRef("arithmetic", "name", "easy", name="arithmetic")),
    ("arithmetic-v1:easy", EnvRef("arithmetic-v1", "name", "easy", name="arithmetic", version=1)),
    ("rg_basic_arithmetic", EnvRef("rg_basic_arithmetic", "name", name="rg_basic_arithmetic")),
    ("./envs/count_vowels", EnvRef("./envs/count_vowels", "path", path=Path("envs/count_vowels"))),
    ("/abs/env.py:hard", EnvRef("/abs/env.py", "path", "hard", path=Path("/abs/env.py"))),
    ("org/arith", EnvRef("org/arith", "hub", repo="org/arith")),
    ("org/arith@3f1c2e9:easy", EnvRef("org/arith@3f1c2e9", "hub", "easy", repo="org/arith", revision="3f1c2e9")),
])
def test_one_parser_reads_every_form_of_reference(text, expected):
    assert parse_ref(text) == expected and str(parse_ref(text)) == text


@pytest.mark.parametrize("text", ["my-env", "9lives", "", "org/a/b", "org/arith@bad..rev", "a b", ":hard", ":"])
def test_what_is_no_reference_is_one_error_naming_the_forms(text):
    with pytest.raises(EnvNotFoundError) as caught:
        parse_ref(text)
    assert "\n" not in str(caught.value) and ("org/name" in str(caught.value) or "revision" in str(caught.value))


def test_a_registered_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arithmetic").mkdir()
    assert open_env("arithmetic").builder.__module__ == "hubgym.builders.arithmetic"


NAMES = ["arithmetic", "count_vowels", "Count_Vowels2", "my-env", "my.env", "9lives", "_private", "x" * 65,
         "ok-v2", "a", "rg_leg_counting"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_caller_applies_the_one_name_rule(name, tmp_path):
    """The builder's ENV (hubgym check), `hubgym init NAME`, and a stored row's env all say yes or no together."""
    from hubgym.conformance import check_env
    from hubgym.authoring.scaffold import validate_env_name

    valid = env_name_problem(name) is None
    assert valid == (name not in ("my-env", "my.env", "9lives", "_private", "x" * 65, "ok-v2"))
    try:
        validate_env_name(name)
        scaffold_ok = True
    except EnvContractError as exc:
        scaffold_ok = "shadow" in exc.what or "taken" in exc.what  # a valid name a package could not use
    assert scaffold_ok == valid, name
    folder = tmp_path / "env"
    folder.mkdir()
    source = (ENVS / "baseline" / "builder.py").read_text().replace('ENV = "baseline"', f"ENV = {name!r}")
    (folder / "builder.py").write_text(source)
    for other in ("verifier.py", "golden.jsonl"):
        (folder / other).write_text((ENVS / "baseline" / other).read_text())
    from hubgym.conformance.checks import check_declaration
    declared = check_env(str(folder), max_rows=1)[0]
    assert declared.check == check_declaration.__name__ and declared.ok == valid, declared.message
    with pytest.raises(EnvNotFoundError) as stored:
        stored_env_verifier(name + "_unregistered" if valid else name)
    assert ("not a built-in or installed env" in str(stored.value))


def test_one_pin_parser_for_every_command():
    assert parse_pins([f"org/arith=sha256:{SHA}"]) == {"org/arith": f"sha256:{SHA}"}
    assert parse_pins(f"sha256:{SHA.upper()}", revisions=["org/arith@3f1c2e9"]) == {"org/arith": f"sha256:{SHA}"}
    assert parse_pins({"org/arith@3f1c2e9": SHA}) == {"org/arith": f"sha256:{SHA}"}
    with pytest.raises(VerifierNotTrustedError, match=r"names no repo, and 2 hub env revisions are given"):
        parse_pins(f"sha256:{SHA}", revisions=["a/b", "c/d"])
    with pytest.raises(VerifierNotTrustedError, match=r"pin 'sha256:abc' is not a sha256"):
        parse_pins(["org/arith=sha256:abc"])
    with pytest.raises(VerifierNotTrustedError, match=r"'org' is not a hub repo \(org/name\)"):
        parse_pins([f"org=sha256:{SHA}"])
    with pytest.raises(VerifierNotTrustedError, match=r"two different pins for org/arith"):
        parse_pins([f"org/arith=sha256:{SHA}", f"org/arith@main=sha256:{'0' * 64}"])
