"""`finetune push RUN_DIR REPO_ID`: upload a run's final checkpoint (weights, tokenizer, recipe, model card) to the hub.

The folder uploaded is RUN_DIR/checkpoint (or RUN_DIR itself when it is a checkpoint folder): what
`from_pretrained` reads, plus finetune_recipe.yaml and the model card README.md written at the end of the run.
Periodic checkpoints, metrics and plots stay local. A missing token, an unreachable hub or a refused upload is
one line naming the cause.
"""

from __future__ import annotations

from pathlib import Path

from finetune.console import console
from finetune.errors import UserError
from finetune.run_dir import CHECKPOINT_DIR


def checkpoint_folder(run_dir: Path) -> Path:
    """The finished checkpoint of a run directory, or the folder itself when it is one."""
    run_dir = Path(run_dir)
    for folder in (run_dir / CHECKPOINT_DIR, run_dir):
        if (folder / "config.json").is_file():
            return folder
    if not run_dir.is_dir():
        raise UserError(f"RUN_DIR: no such folder: {run_dir}")
    raise UserError(
        f"RUN_DIR: {run_dir} holds no finished checkpoint ({run_dir / CHECKPOINT_DIR}/config.json "
        "is written when a run ends)"
    )


def push_checkpoint(run_dir: Path, repo_id: str, private: bool = False, token: str | None = None, api=None) -> str:
    """Create the model repository if needed and upload the checkpoint in one commit; returns its URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, LocalTokenNotFoundError

    folder = checkpoint_folder(run_dir)
    if not (folder / "README.md").is_file():
        console.print(f"{folder} has no model card (README.md): a run of an older version; the hub shows none")
    api = api or HfApi(token=token)
    try:
        user = api.whoami()
    except LocalTokenNotFoundError:
        raise UserError(
            "no Hugging Face token: run `hf auth login` or set HF_TOKEN (a token with write access)"
        ) from None
    except HfHubHTTPError as error:
        raise UserError(f"the hub refused the token: {_reason(error)}") from None
    except _network_errors() as error:
        raise UserError(f"cannot reach the Hugging Face hub ({type(error).__name__}): check the network") from None
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        run_name = folder.parent.name if folder.name == CHECKPOINT_DIR else folder.name
        api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=f"Upload {run_name} with finetune")
    except HfHubHTTPError as error:
        raise UserError(
            f"REPO_ID {repo_id}: the hub refused the upload as {user.get('name', 'this user')}: {_reason(error)}"
        ) from None
    except _network_errors() as error:
        raise UserError(f"cannot reach the Hugging Face hub ({type(error).__name__}): check the network") from None
    console.print(f"uploaded {folder} to {url}")
    return str(url)


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a failed connection raises: OSError, and the transport errors of the HTTP client huggingface_hub uses
    (httpx2 in huggingface_hub 2.x, httpx in 1.x)."""
    errors: list[type[BaseException]] = [OSError]
    try:
        import httpx2

        errors.append(httpx2.TransportError)
    except ImportError:
        pass
    try:
        import httpx

        errors.append(httpx.TransportError)
    except ImportError:
        pass
    return tuple(errors)


def _reason(error: Exception) -> str:
    """The first line of a hub error: its status and message."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
