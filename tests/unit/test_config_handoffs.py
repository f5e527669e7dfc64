"""Deaths that need a change carry a concrete handoff (docs/domain.md#deaths-that-need-a-change):
for every configuration-class failure the catalogue knows, the handoff quotes the line, names the
likely cause, the affected key, module or path read from the line (redacted), the behaviour to
propose and a test that proves the fix. Each case is a verbatim line of
tests/fixtures/real_failures/."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from worker.evidence.failures import FailureClass, catalogue
from worker.evidence.logs import parse_log_file
from worker.evidence.quotes import quote_rows
from worker.gates.configuration import config_handoff, failure_subject

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real_failures"

# (fixture url, a substring of the line, the key / module / path the handoff must name)
CASES = [
    (
        "https://github.com/taokz/BiomedGPT/issues/75",
        "Could not override",
        "common.no_progress_bar",
    ),
    (
        "https://github.com/Sachini/niloc/issues/10",
        "is not in struct",
        "io",
    ),
    (
        "https://github.com/omry/omegaconf/issues/209",
        "drover",
        "drover",
    ),
    (
        "https://github.com/hydra-ecosystem/hydra/pull/1551",
        "In config: Override",
        "hydra/hydra_logging : colorlog",
    ),
    (
        "https://github.com/yangchris11/samurai/issues/44",
        "primary config",
        "configs/samurai/sam2.1_hiera_b+.yaml",
    ),
    (
        "https://github.com/isaac-sim/IsaacLab/issues/2537",
        "Error parsing override",
        "env.episode_length_s",
    ),
    (
        "https://github.com/hydra-ecosystem/hydra/issues/836",
        "OverrideParseException",
        "[string1,",
    ),
    (
        "https://github.com/facebookresearch/textlesslib/issues/37",
        "ValidationError",
        "50.0",
    ),
    (
        "https://github.com/philip-mueller/wsrpn/issues/2",
        "Missing mandatory",
        "model.backbone.ignore_last_stride",
    ),
    (
        "https://github.com/NVIDIA-NeMo/RL/issues/662",
        "No module named",
        "nemo",
    ),
    (
        "https://github.com/ray-project/ray/issues/44264",
        "No module named",
        "kaiko.llm_serve",
    ),
    (
        "https://github.com/vllm-project/vllm/issues/14401",
        "cannot import name",
        "'LogitsWarper' from 'transformers.generation.logits_process'",
    ),
    (
        "https://github.com/WangRongsheng/XrayGLM/issues/89",
        "FileNotFoundError",
        "THUDM/visualglm-6b/model_config.json",
    ),
    (
        "https://github.com/360CVGroup/SEEChat/issues/4",
        "FileNotFoundError",
        "../models/chatglm-6b/checkpoint_100.pth",
    ),
    (
        "https://github.com/daytonaio/daytona/issues/3304",
        "Total CPU limit",
        "Total CPU limit",
    ),
    (
        "https://github.com/daytonaio/daytona/issues/5076",
        "Snapshot with ID",
        "f1b3e106-941c-46c9-9583-6cd1450d3536",
    ),
    (
        "https://github.com/NousResearch/hermes-agent/pull/114536",
        "pull access denied",
        "docker.io/library/<snapshot-name>:latest",
    ),
    (
        "https://github.com/QwenLM/Qwen3/issues/295",
        "32768",
        "32768",
    ),
]


def _lines() -> list[dict[str, Any]]:
    found = []
    for path in sorted(FIXTURES.glob("*.toml")):
        found += tomllib.loads(path.read_text("utf-8")).get("line", [])
    return found


def _line(url: str, contains: str) -> str:
    texts = [case["text"] for case in _lines() if case["url"] == url and contains in case["text"]]
    assert len(texts) == 1, (url, contains)
    return str(texts[0])


def _row(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "finelog.log"
    path.write_text(text + "\n", encoding="utf-8")
    errors = parse_log_file(path, "finelog.log").errors
    assert errors.height == 1
    return errors.row(0, named=True)


@pytest.mark.parametrize(("url", "contains", "subject"), CASES, ids=[c[2][:40] for c in CASES])
def test_each_configuration_death_hands_off_what_it_names(
    url: str, contains: str, subject: str, tmp_path: Path
) -> None:
    """The handoff of a real configuration-class line names the key, module or path it read from
    the line in the component to change, quotes the line as evidence, gives the entry's note as
    the likely cause, a behaviour to propose and a test ending on a relaunch that steps."""
    text = _line(url, contains)
    row = _row(tmp_path, text)
    assert row["failure_class"] == "configuration"
    quotes = quote_rows(pl.DataFrame([row]))
    handoff = config_handoff(row, quotes)
    assert handoff is not None
    assert subject in handoff.component, handoff.component
    assert handoff.evidence and handoff.evidence[0].text in text
    assert f"catalogue `{row['entry']}`" in handoff.likely_cause
    assert handoff.proposed_behavior and "the one the error names" not in handoff.proposed_behavior
    assert "Finished: 'step'" in handoff.test


def test_every_shipped_configuration_entry_carries_its_own_handoff() -> None:
    """Each configuration-class catalogue entry states what to change, the behaviour and the
    test itself (none falls back on its component's generic text)."""
    entries = [e for e in catalogue().entries if e.failure_class is FailureClass.CONFIGURATION]
    assert len(entries) >= 15
    assert all(e.change and e.behaviour and e.test for e in entries), [
        e.id for e in entries if not (e.change and e.behaviour and e.test)
    ]


def test_every_subject_entry_is_exercised_here() -> None:
    """Every configuration entry that reads a subject from its line has a case above."""
    covered = set()
    for url, contains, _ in CASES:
        entry = catalogue().first_match(_line(url, contains))
        assert entry is not None
        covered.add(entry.id)
    wanted = {
        e.id
        for e in catalogue().entries
        if e.failure_class is FailureClass.CONFIGURATION and e.subject
    }
    assert wanted <= covered, wanted - covered


def test_a_module_handoff_asks_for_an_image_rebuild(tmp_path: Path) -> None:
    """A missing module is an image change: the handoff names the image and the package, and the
    test imports the module in the rebuilt image."""
    row = _row(tmp_path, _line("https://github.com/NVIDIA-NeMo/RL/issues/662", "nemo"))
    handoff = config_handoff(row, ())
    assert handoff is not None
    assert "container image" in handoff.component
    assert "rebuild" in handoff.proposed_behavior
    assert "import nemo" in handoff.test


def test_a_credential_in_a_path_is_redacted_from_the_handoff(tmp_path: Path) -> None:
    """A missing path that holds a token is named redacted: the handoff never repeats it."""
    token = "hf_" + "a" * 34
    text = f"FileNotFoundError: [Errno 2] No such file or directory: '/models/{token}/config.json'"
    row = _row(tmp_path, text)
    handoff = config_handoff(row, ())
    assert handoff is not None
    assert token not in handoff.component and token not in handoff.test
    entry = catalogue().by_id("python.file_not_found")
    subject = failure_subject(entry, row)
    assert subject is not None and "/models/" in subject and token not in subject


def test_a_runtime_path_is_no_configuration_death(tmp_path: Path) -> None:
    """A file that vanished under /tmp or /proc (Ray#714, Ray#47524) is a runtime race, not the
    image's contents: class hard, no handoff; a model path is configuration (the pair)."""
    runtime = _row(tmp_path, _line("https://github.com/ray-project/ray/issues/47524", "/proc"))
    assert runtime["failure_class"] == "hard"
    assert config_handoff(runtime, ()) is None
    image = _row(tmp_path, _line("https://github.com/WangRongsheng/XrayGLM/issues/89", "No such"))
    assert image["failure_class"] == "configuration"
    assert config_handoff(image, ()) is not None
