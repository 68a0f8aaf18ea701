"""Re-scoring on a Ray cluster: the shards (or batches) of a re-score mapped over the cluster as Ray tasks.

    result = rescore_on_ray("runs/r1", verifier="my_envs/arith_v2.py", out="runs/r1-v2", address="auto")
    hubgym score runs/r1 --verifier my_envs/arith_v2.py --out runs/r1-v2 --ray --ray-address HEAD:6379

hubgym.rescore does the work as on one machine (the same output folder, manifest, counts and diff report);
only what scores is swapped: RayScorer runs each piece of work as a Ray task instead of in a local process
pool. A local shard is re-scored where a task runs (`rescore_shards`: it reads the shard and writes its output
shard itself), so the sources and the output folder must be on a filesystem every node sees, at the same path;
a node that does not see them stops the re-score with one line naming it. Batches of a hub stream or of
record batches travel to the tasks as Arrow IPC bytes and need no shared filesystem.

A verifier given as a .py file travels with the work: a node without that file writes the driver's bytes to
a cache of its own, and load_verifier_of checks they hash to the verifier chosen, so every node scores with
byte-identical code.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from hubgym.cluster.ray_common import ClusterError, connect, node_label

__all__ = ["RayScorer", "rescore_on_ray"]


def rescore_on_ray(source, *, address: str | None = None, workers: int | None = None, **options: Any):
    """hubgym.rescore(source, **options), its work done by Ray tasks on the cluster at `address` (None: Ray's
    default). `workers`: tasks in flight [default: twice the cluster's CPUs]."""
    from hubgym.score.rescore import rescore

    ray = connect(address)
    return rescore(source, scorer=RayScorer(ray, workers), **options)


class RayScorer:
    """rescore's Scorer, whose work runs as Ray tasks: `shard` (a local shard file) and `batch` (a slim batch)."""

    def __init__(self, ray: Any, workers: int | None = None):
        self.ray = ray
        self.in_flight = workers or max(2 * int(ray.cluster_resources().get("CPU", 1)), 2)
        self.pending: list[Any] = []
        self._shards = ray.remote(num_cpus=1, max_retries=3)(rescore_shards_on_node)
        self._batch = ray.remote(num_cpus=1, max_retries=3)(score_batch_on_node)

    def __enter__(self) -> "RayScorer":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:  # a failed re-score leaves no task running
            for ref in self.pending:
                self.ray.cancel(ref, force=True)

    def depth(self) -> int:
        return self.in_flight

    def bundle_rows(self) -> int:
        return 1  # a task per shard: the cluster's many workers share a re-score out finely

    def shards(self, shards: list, specs: Mapping[str, Any], outs: list[Path | None]) -> Future:
        return self._future(self._shards.remote(list(shards), dict(specs), list(outs), verifier_sources(specs)))

    def batch(self, specs: Mapping[str, Any], batch) -> Future:
        from hubgym.score.scoring import to_ipc

        return self._future(self._batch.remote(dict(specs), to_ipc(batch), verifier_sources(specs)))

    submit = batch  # the name rescore's Scorer had for `batch`

    def _future(self, ref: Any) -> Future:
        self.pending.append(ref)  # cancelled on failure (a finished one is left as it is)
        outer: Future = Future()
        ref.future().add_done_callback(lambda done: _settle(outer, done, self.ray))
        return outer


def _settle(outer: Future, done: Future, ray: Any) -> None:
    """The task's value, or its error as itself (a hubgym error of the work), else as one ClusterError line."""
    try:
        outer.set_result(done.result())
    except Exception as exc:
        cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else None
        if cause is not None and isinstance(cause, Exception) and type(cause).__module__.startswith("hubgym"):
            outer.set_exception(cause)
        elif isinstance(exc, ray.exceptions.RayTaskError):
            outer.set_exception(exc)
        else:
            outer.set_exception(ClusterError(f"a re-scoring task died and was retried 3 times, so the re-score "
                                             f"stops: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
                                             f"; run it again"))


def verifier_sources(specs: Mapping[str, Any]) -> dict[str, bytes]:
    """{path: bytes} of the verifiers loaded from a file (a user's .py, a hub env's): what other nodes may lack."""
    sources = {}
    for spec in specs.values():
        path = Path(spec.path)
        if spec.origin != "registry" and path.is_file():
            sources[spec.path] = path.read_bytes()
    return sources


def localized(specs: Mapping[str, Any], sources: Mapping[str, bytes]) -> dict[str, Any]:
    """The specs, with each verifier file this node lacks (or holds other bytes of) written to a local cache."""
    out = {}
    for env, spec in specs.items():
        source = sources.get(spec.path)
        path = Path(spec.path)
        if source is not None and not (path.is_file() and path.read_bytes() == source):
            import hashlib

            cached = Path(tempfile.gettempdir()) / "hubgym-verifiers" / hashlib.sha256(source).hexdigest() / path.name
            if not cached.is_file():
                from hubgym.files import atomic_write_bytes

                atomic_write_bytes(cached, source)
            spec = replace(spec, path=str(cached))
        out[env] = spec
    return out


def rescore_shards_on_node(shards: list, specs: dict[str, Any], outs: list[Path | None], sources: dict[str, bytes]):
    """rescore_shards in a Ray task, after checking this node sees the shards and the output folder."""
    from hubgym.score.shards import rescore_shards

    for shard, out in zip(shards, outs):
        location = getattr(shard, "location", str(shard))
        if "://" not in location and not Path(location).exists():
            raise ClusterError(f"node {node_label()} does not see the shard {location} the driver reads; put the "
                               f"rollouts on a filesystem every node mounts at the same path (or re-score on one "
                               f"machine: leave out --ray)", node=node_label())
        if out is not None and not Path(out).parent.is_dir():
            raise ClusterError(f"node {node_label()} does not see the output folder {Path(out).parent} the driver "
                               f"made; give --out a folder on a filesystem every node mounts at the same path",
                               node=node_label())
    return rescore_shards(shards, localized(specs, sources), outs)


def score_batch_on_node(specs: dict[str, Any], data: bytes, sources: dict[str, bytes]):
    """score_ipc in a Ray task: the new columns of a slim batch sent as IPC bytes."""
    from hubgym.score.scoring import score_ipc

    return score_ipc(localized(specs, sources), data)
