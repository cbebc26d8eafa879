"""What users read points only at what they have.

The library, the kernels, the docs and the README cite papers by authors,
title and year (References blocks), never by the file ids of a team's copy
("004"); they never point into a `shared/` folder that users do not have, and
they do not use the team's words for things ("the main job", "the peers").
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AREAS = {
    "jaxfl": sorted((ROOT / "jaxfl").rglob("*.py")),
    "kernels": sorted((ROOT / "kernels").rglob("*.py")),
    "docs": sorted((ROOT / "docs").rglob("*.md")),
    "README": [ROOT / "README.md"],
}
PATTERNS = {
    "a path into shared/": re.compile(r"(?:\.\./)?\bshared/(?:papers|notes|peers)\b|\.\./shared\b"),
    "a bare paper id": re.compile(r"(?<![\w.,\-/])00[0-4](?![\w.,])"),
    "the notes' name for the thesis digest": re.compile(r"thesis-spec", re.IGNORECASE),
    "a team word": re.compile(r"\b(?:the peers|main job)\b", re.IGNORECASE),
}


def offending_lines(paths) -> list[str]:
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in PATTERNS.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()[:100]}")
    return found


@pytest.mark.parametrize("area", sorted(AREAS))
def test_no_pointers_users_cannot_follow(area):
    found = offending_lines(AREAS[area])
    assert not found, f"{len(found)} lines:\n" + "\n".join(found[:40])


@pytest.mark.parametrize(
    "line, flagged",
    [
        ("(004 Appendix C.3)", True),
        ("papers 000/004: App. C", True),
        ("see ../shared/notes/thesis-spec.md", True),
        ("shared/papers/004_81c8af14ec6ef25c.txt", True),
        ("lr 0.004, 2,000 rounds", False),
        ("seed 2004 and port 8004", False),
        ("(Pillutla et al. 2023, Appendix C.3)", False),
        ("the README's main job", True),
        ("jax.sharding and shared memory", False),
    ],
)
def test_the_patterns(line, flagged):
    hits = [what for what, pattern in PATTERNS.items() if pattern.search(line)]
    assert bool(hits) == flagged, hits
