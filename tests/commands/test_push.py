"""`finetune push`: the run's checkpoint goes to the hub in one upload; no token or no network is one line, exit 2.

The hub is never contacted: uploads go to a stub of huggingface_hub's HfApi, and the failure cases point the real
client at a closed local port or at an empty token store.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from finetune.cli import app
from finetune.commands.push import push_checkpoint
from finetune.errors import UserError
from tests.conftest import save_tiny_masked_lm

runner = CliRunner()


class StubHub:
    """The part of HfApi that push uses, recording each call; `refuse` makes the upload fail like the hub does."""

    def __init__(self, refuse: bool = False):
        self.calls, self.refuse = [], refuse

    def whoami(self):
        self.calls.append(("whoami",))
        return {"name": "someone"}

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.calls.append(("create_repo", repo_id, private, exist_ok))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, repo_id, folder_path, commit_message=None):
        from huggingface_hub.errors import HfHubHTTPError

        if self.refuse:
            client = pytest.importorskip("httpx2", reason="huggingface_hub 2.x's HTTP client builds the error")
            response = client.Response(403, request=client.Request("POST", "https://huggingface.co/api/x"))
            raise HfHubHTTPError("403 Forbidden: you have no write access to this repository", response=response)
        self.calls.append(
            ("upload_folder", repo_id, sorted(path.name for path in Path(folder_path).iterdir()), commit_message)
        )


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run directory with a finished checkpoint (and, beside it, files that must not be uploaded)."""
    run = tmp_path / "run"
    save_tiny_masked_lm(run.parent / "lm")
    (run / "checkpoints").mkdir(parents=True)
    (tmp_path / "lm" / "checkpoint").rename(run / "checkpoint")
    (run / "checkpoint" / "README.md").write_text("---\nlibrary_name: transformers\n---\n# card\n")
    (run / "metrics.jsonl").write_text("{}\n")
    return run


def test_uploads_the_checkpoint_folder_only(run_dir):
    hub = StubHub()
    url = push_checkpoint(run_dir, "someone/tiny", private=True, api=hub)
    assert url == "https://huggingface.co/someone/tiny"
    assert hub.calls[0] == ("whoami",) and hub.calls[1] == ("create_repo", "someone/tiny", True, True)
    name, repo, files, message = hub.calls[2]
    assert (name, repo) == ("upload_folder", "someone/tiny") and message == "Upload run with finetune"
    assert {"config.json", "model.safetensors", "README.md"} <= set(files) and "metrics.jsonl" not in files
    assert push_checkpoint(run_dir / "checkpoint", "someone/tiny", api=StubHub())  # the folder itself works too


def test_cli_uploads_through_the_client(run_dir, monkeypatch):
    hub = StubHub()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda token=None: hub)
    result = runner.invoke(app, ["push", str(run_dir), "someone/tiny"])
    assert result.exit_code == 0, result.output
    assert [call[0] for call in hub.calls] == ["whoami", "create_repo", "upload_folder"]


def test_a_refused_upload_is_one_line(run_dir):
    with pytest.raises(UserError, match="REPO_ID someone/tiny: the hub refused the upload as someone: 403"):
        push_checkpoint(run_dir, "someone/tiny", api=StubHub(refuse=True))


def test_no_token_is_one_line_and_exit_2(run_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))  # no stored token either
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    result = runner.invoke(app, ["push", str(run_dir), "someone/tiny"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: no Hugging Face token") and len(result.output.splitlines()) == 1


def test_no_network_is_one_line_and_exit_2(run_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there: the connection is refused
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    result = runner.invoke(app, ["push", str(run_dir), "someone/tiny"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().startswith("error: cannot reach the Hugging Face hub")


def test_a_run_without_a_checkpoint_is_refused(tmp_path):
    (tmp_path / "unfinished").mkdir()
    result = runner.invoke(app, ["push", str(tmp_path / "unfinished"), "someone/tiny"])
    assert result.exit_code == 2 and "holds no finished checkpoint" in result.output
    result = runner.invoke(app, ["push", str(tmp_path / "absent"), "someone/tiny"])
    assert result.exit_code == 2 and "no such folder" in result.output
