"""Hugging Face Hub model ids -> snapshot directories in the hub cache, as vLLM downloads them.

`snapshot_download` fetches only the files the engine reads (`MODEL_PATTERNS`: configs,
tokenizer files, safetensors weights and their index) into the hub cache layout
(`models--org--name/snapshots/<commit>/`): under `cache_dir` when given, else where
huggingface_hub puts it (`HF_HUB_CACHE`, or `HF_HOME/hub`). With `HF_HUB_OFFLINE=1` it
resolves a revision from the cache alone. Every failure is a `ValueError` naming the id.
"""

import os

import huggingface_hub
from huggingface_hub import constants, errors

TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
"""The files a tokenizer may consist of (a fast tokenizer's JSON, or a slow one's vocabulary)."""
MODEL_PATTERNS = (
    "config.json",
    "generation_config.json",
    *TOKENIZER_PATTERNS,
    "*.safetensors",
    "model.safetensors.index.json",
)
"""What `download_model` fetches: everything the engine and its tokenizer read."""


def download_model(model_id: str, revision: str | None, cache_dir: str | None) -> str:
    """The snapshot directory of the hub model `model_id` at `revision` (a branch, tag or
    commit hash; the default branch when None), downloaded into `cache_dir` if missing."""
    path = _snapshot("model", model_id, revision, cache_dir, MODEL_PATTERNS)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model {model_id!r} (revision {revision or 'main'!r}) has no config.json on the Hub.")
    return path


def download_tokenizer(tokenizer_id: str, revision: str | None, cache_dir: str | None) -> str:
    """The snapshot directory holding the tokenizer files of `tokenizer_id` at `revision`
    (config.json too: some tokenizers name their class only there)."""
    return _snapshot("tokenizer", tokenizer_id, revision, cache_dir, ("config.json", *TOKENIZER_PATTERNS))


def _snapshot(name: str, repo_id: str, revision: str | None, cache_dir: str | None, patterns) -> str:
    """`name` is the argument the id came from ("model" or "tokenizer"), for the errors."""
    where = f"{name} {repo_id!r} (revision {revision or 'main'!r})"
    try:
        return huggingface_hub.snapshot_download(
            repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=list(patterns)
        )
    except errors.HFValidationError:
        raise ValueError(
            f"{name} must be a model directory or a Hugging Face Hub model id like 'org/name', got "
            f"{repo_id!r}: no such directory, and not a valid model id."
        ) from None
    except errors.LocalEntryNotFoundError:
        cache = cache_dir or constants.HF_HUB_CACHE
        if constants.HF_HUB_OFFLINE:
            raise ValueError(
                f"{where} is not in the Hugging Face cache {cache} (or only in part), and the Hub is "
                "offline (HF_HUB_OFFLINE is set): download it once online, or give a download_dir "
                "that holds it."
            ) from None
        raise ValueError(f"{where} is not in the Hugging Face cache {cache}, and the Hub cannot be reached.") from None
    except errors.RevisionNotFoundError:
        revision_arg = "revision" if name == "model" else "tokenizer_revision"
        raise ValueError(f"{revision_arg} {revision!r} does not exist for {name} {repo_id!r} on the Hub.") from None
    except errors.GatedRepoError:
        raise ValueError(
            f"{name} {repo_id!r} is gated on the Hub: accept its terms there and log in "
            "(`hf auth login`, or set HF_TOKEN)."
        ) from None
    except errors.RepositoryNotFoundError:
        raise ValueError(
            f"{name} {repo_id!r} is neither a local directory nor a model on the Hugging Face Hub "
            "(a private model needs `hf auth login` or HF_TOKEN)."
        ) from None
    except errors.HfHubHTTPError as e:
        raise ValueError(f"{where} could not be downloaded from the Hugging Face Hub: {e}") from None
