"""A Hugging Face hub cache written by hand, in the layout huggingface_hub downloads into
and resolves from offline:

    <cache>/models--org--name/blobs/<sha256 of a file's bytes>
    <cache>/models--org--name/snapshots/<commit>/<file name>  -> ../../blobs/<sha256>
    <cache>/models--org--name/refs/<branch or tag>             holding <commit>
"""

import hashlib
import os
import pathlib


def add_snapshot(cache_dir, repo_id: str, files_dir, commit: str, ref: str | None = None) -> str:
    """Adds the files of `files_dir` as `repo_id`'s snapshot at `commit` (40 hex digits),
    named by `ref` too when given; returns the snapshot directory."""
    repo = pathlib.Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for path in sorted(pathlib.Path(files_dir).iterdir()):
        data = path.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (blobs / blob).write_bytes(data)
        (snapshot / path.name).symlink_to(os.path.join("..", "..", "blobs", blob))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return str(snapshot)
