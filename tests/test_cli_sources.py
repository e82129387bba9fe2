"""``captum-cw sources``: the sources ranked for a response, the HTML view, and one-line refusals."""

from __future__ import annotations

import pytest

from captum_cw.cli import main


def test_sources_are_ranked_and_the_page_written(tmp_path, capsys):
    page = tmp_path / "sources.html"
    assert main(["sources", "--source", "Anna lives in Paris.", "--source", "Tom lives in Rome.",
                 "--query", "Where does Tom live?", "--response", " Rome", "--chat", "no", "--html", str(page)]) == 0
    printed = capsys.readouterr().out
    assert "Response: ' Rome'" in printed and "[1] Tom lives in Rome." in printed
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_knockout_is_a_method_of_the_verb(capsys):
    assert main(["sources", "--source", "Anna lives in Paris.", "--source", "Tom lives in Rome.",
                 "--query", "Where does Tom live?", "--response", " Rome", "--method", "knockout"]) == 0
    assert "[1] Tom lives in Rome." in capsys.readouterr().out


def test_a_foil_is_contrasted(capsys):
    assert main(["sources", "--source", "Anna lives in Paris.", "--source", "Tom lives in Rome.",
                 "--query", "Where does Tom live?", "--response", " Rome", "--foil", " Paris"]) == 0
    assert "Response: ' Rome' rather than ' Paris' (log-odds = " in capsys.readouterr().out


def test_sources_from_a_file(tmp_path, capsys):
    listed = tmp_path / "sources.txt"
    listed.write_text("Anna lives in Paris.\n\nTom lives in Rome.\n", encoding="utf-8")
    assert main(["sources", "--sources-file", str(listed), "--query", "Where does Anna live?",
                 "--response", " Paris"]) == 0
    assert "[0] Anna lives in Paris." in capsys.readouterr().out


@pytest.mark.parametrize("arguments, message", [
    (["--query", "x"], "no sources"),
    (["--source", "a", "--query", "x", "--html", "page.txt"], "ending in .html"),
    (["--source", "a", "--query", "x", "--method", "lrp"], "invalid choice: 'lrp'"),
])
def test_bad_arguments_exit_2_with_one_line(arguments, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sources", *arguments])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
