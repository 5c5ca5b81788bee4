"""`keyturn scan`: real keys are found by place, id and hint; look-alikes and secrets are not."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keyturn import _token
from keyturn.cli import main
from keyturn.scan import find_keys, scan_paths

# Text that cannot extend a key: no letters, digits or underscores.
glue = st.text(alphabet=st.sampled_from(" \t\n\"'=:,;()[]{}<>/\\.-+é🔑"), max_size=20)


@given(before=glue, after=glue)
def test_a_key_anywhere_in_text_is_found_once_with_its_place(before: str, after: str) -> None:
    """A key embedded in any surrounding punctuation is found, at its line and column."""
    token = _token.generate()
    text = before + token.token + after
    (finding,) = find_keys(text, "f.py")
    assert (finding.key_id, finding.hint) == (token.key_id, token.hint)
    assert finding.line == before.count("\n") + 1
    assert finding.column == len(before) - (before.rfind("\n") + 1) + 1


@given(st.text())
def test_random_text_holds_no_key(text: str) -> None:
    """Text without a checksummed key yields nothing (a random match is 1 in 5.7e10)."""
    assert list(find_keys(text)) == []


@pytest.mark.parametrize(
    "variant",
    [
        lambda t: t[:-1] + ("a" if t[-1] != "a" else "b"),  # checksum broken
        lambda t: "x" + t,  # glued to a longer word
        lambda t: t + "Z",  # one character too long
        lambda t: "rma_" + "x" * 46,  # a placeholder in docs
    ],
    ids=["bad checksum", "glued before", "glued after", "placeholder"],
)
def test_look_alikes_are_not_reported(variant: object) -> None:
    """Only well-formed keys count: typos, longer tokens and placeholders are ignored."""
    token = _token.generate().token
    assert list(find_keys(variant(token))) == []  # type: ignore[operator]


def test_scan_walks_folders_and_skips_tool_state_and_binaries(tmp_path: Path) -> None:
    """Keys in source files are found; .git, virtual environments and binary files are skipped."""
    token = _token.generate()
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "settings.py").write_text(f'API_KEY = "{token.token}"\n')
    for skipped in (".git", ".venv", "node_modules"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "leak.txt").write_text(token.token)
    (tmp_path / "blob.bin").write_bytes(b"\0\1" + token.token.encode())
    findings = list(scan_paths([tmp_path]))
    assert [(Path(f.source).name, f.line, f.column) for f in findings] == [("settings.py", 1, 12)]


def test_cli_reports_hints_never_secrets_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`keyturn scan` prints place, id and hint, exits 1, and never prints the secret."""
    token = _token.generate()
    (tmp_path / "notes.md").write_text(
        f"try it:\n  curl -H 'Authorization: Bearer {token.token}'\n"
    )
    assert main(["scan", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert f"notes.md:2:34: {token.hint} (key id {token.key_id})" in out
    assert "revoke them" in err
    assert token.secret not in out + err


def test_cli_exits_0_on_a_clean_tree_and_reads_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tree without keys exits 0; '-' scans standard input, as in a pre-commit hook."""
    (tmp_path / "clean.py").write_text("KEY = 'rma_...'  # placeholder\n")
    assert main(["scan", str(tmp_path)]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("+ key = " + _token.generate().token))
    assert main(["scan", "-"]) == 1
    assert "<stdin>:1:9:" in capsys.readouterr().out


def test_this_repository_holds_no_key() -> None:
    """No key is committed anywhere in the project's own tree."""
    root = Path(__file__).resolve().parents[2]
    assert [str(f) for f in scan_paths([root])] == []
