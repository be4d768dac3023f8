"""Committed repository files found from a checkout, a local copy, or a download (attnlib._repo)."""

from __future__ import annotations

import pytest

from attnbook.repo import committed_file

REL = "benchmarks/results/bench_paths.json"


@pytest.fixture()
def no_repo_env(monkeypatch, tmp_path):
    for name in ("ATTNLIB_REPO_DIR", "ATTNLIB_REPO_RAW"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATTNLIB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_found_in_the_checkout(no_repo_env):
    path = committed_file(REL)
    assert path.is_file() and path.as_posix().endswith(REL)


def test_local_copy_comes_first(no_repo_env, monkeypatch):
    copy = no_repo_env / "copy"
    (copy / "benchmarks/results").mkdir(parents=True)
    (copy / REL).write_text('{"copy": true}')
    monkeypatch.setenv("ATTNLIB_REPO_DIR", str(copy))
    assert committed_file(REL) == copy / REL


def test_downloaded_once_into_the_cache(no_repo_env, monkeypatch):
    served = no_repo_env / "served"
    (served / "benchmarks/results").mkdir(parents=True)
    (served / "benchmarks/results/only_remote.json").write_text('{"remote": 1}')
    monkeypatch.setenv("ATTNLIB_REPO_RAW", served.as_uri())
    path = committed_file("benchmarks/results/only_remote.json")
    assert path.read_text() == '{"remote": 1}'
    assert path.is_relative_to(no_repo_env / "cache")
    (served / "benchmarks/results/only_remote.json").unlink()  # the cached copy is used from now on
    assert committed_file("benchmarks/results/only_remote.json") == path


def test_missing_file_names_it_and_the_settings(no_repo_env):
    with pytest.raises(FileNotFoundError, match="only_remote.json.*ATTNLIB_REPO_DIR.*ATTNLIB_REPO_RAW"):
        committed_file("benchmarks/results/only_remote.json")


def test_failed_download_is_one_clear_error(no_repo_env, monkeypatch):
    monkeypatch.setenv("ATTNLIB_REPO_RAW", (no_repo_env / "nothing").as_uri())
    with pytest.raises(FileNotFoundError, match="could not download"):
        committed_file("benchmarks/results/absent.json")


@pytest.mark.parametrize("bad", ["/etc/passwd", "../outside.json"])
def test_paths_outside_the_repository_are_refused(bad):
    with pytest.raises(ValueError, match="inside the repository"):
        committed_file(bad)
