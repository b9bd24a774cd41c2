"""Ring attention over torch.distributed: a sequence split across workers, exact (chapter 12).

Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise Transformers". The sequence is cut
into P contiguous blocks, one per rank (the first ``T mod P`` blocks one position longer). Each
rank keeps its query block; the key/value blocks travel round the ring (rank r sends to r + 1
and receives from r - 1), so after P steps every rank has seen every key block. Each step's
partial result ``(O_b, lse_b)`` is merged into the running one with the online-softmax merge
of chapter 09 (:func:`merge_partials`), so the result is exact. The next block's transfer is
posted (``isend``/``irecv``) before the current block is computed, so communication can hide
behind compute. Causal masking uses global positions; a key block entirely after a rank's
queries is skipped (that is the causal load imbalance striped attention fixes).

:func:`ring_attention_local` is the per-rank function: it runs inside any initialised process
group (gloo on CPU, NCCL on GPUs, under ``torchrun`` across machines). :func:`ring_attention`
starts ``world_size`` local processes (:func:`run_local`: gloo, 127.0.0.1, a free port), runs it
and returns the gathered output. :func:`ring_attention_simulated` runs the same loop for every
rank in one process, the blocks handed on by a list instead of the network (tests, the book).
Forward only: no autograd through the ring.
"""
from __future__ import annotations

import datetime
import pickle
import socket
import time

import torch

from ._checks import check_attention_args, check_bool, check_float, check_int, check_tensor
from .reference import AttentionResult, attention_ref

__all__ = ["merge_partials", "ring_attention", "ring_attention_local", "ring_attention_simulated",
           "run_local", "split_lengths"]


def merge_partials(out_a, lse_a, out_b, lse_b):
    """Merge two attention results over disjoint key sets (the chapter 09 merge).

    ``lse = logaddexp(lse_a, lse_b)``, ``O = exp(lse_a - lse) O_a + exp(lse_b - lse) O_b``.
    A row masked in both parts (``lse = -inf``) stays ``O = 0``, ``lse = -inf`` (no NaN).
    Args: out ``(..., T, Dv)``, lse ``(..., T)``. Returns ``(out, lse)``.
    """
    lse = torch.logaddexp(lse_a, lse_b)                       # lse = log(e^lse_a + e^lse_b)
    ref = lse.masked_fill(torch.isneginf(lse), 0.0)           # no exp(-inf - (-inf))
    w_a, w_b = torch.exp(lse_a - ref)[..., None], torch.exp(lse_b - ref)[..., None]
    return w_a * out_a + w_b * out_b, lse


def split_lengths(t: int, world_size: int) -> list[int]:
    """The block length of each rank: ``T`` cut into ``world_size`` contiguous blocks whose
    lengths differ by at most one (the first ``T mod P`` are longer), as ``torch.tensor_split``
    cuts."""
    t = check_int("t", t, fn="split_lengths", minimum=0)
    p = check_int("world_size", world_size, fn="split_lengths")
    return [t // p + (r < t % p) for r in range(p)]


def _block(q, kv, d, q0, k0, causal, scale):
    """Attention of the query block (global positions q0..) over one key/value block (k0..)."""
    k, v = kv[..., :d], kv[..., d:]
    tq, tk = q.shape[-2], k.shape[-2]
    if causal and k0 > q0 + tq - 1:                           # every key after every query: skip
        return q.new_zeros(*q.shape[:-1], v.shape[-1]), q.new_full(q.shape[:-1], float("-inf"))
    mask = None
    if causal:                                                # key j visible iff k0 + j <= q0 + i
        i, j = q0 + torch.arange(tq, device=q.device), k0 + torch.arange(tk, device=q.device)
        mask = j <= i[:, None]                                # (tq, tk) global positions
    res = attention_ref(q, k, v, mask=mask, scale=scale)
    return res.out, res.lse


def _ring_loop(q, kv, d, rank, lengths, causal, scale, pass_on):
    """One rank's P steps: at step s it holds the key/value block of rank (r - s) mod P.

    ``pass_on(kv, s)`` starts handing ``kv`` on and returns a function that waits for the next
    block. The same loop runs over the network and in the simulation.
    """
    p = len(lengths)
    starts = [sum(lengths[:r]) for r in range(p)]
    out = q.new_zeros(*q.shape[:-1], kv.shape[-1] - d)        # O = 0
    lse = q.new_full(q.shape[:-1], float("-inf"))              # lse = -inf
    for s in range(p):
        src = (rank - s) % p
        receive = pass_on(kv, s) if s < p - 1 else None      # post the transfer first...
        o_b, lse_b = _block(q, kv, d, starts[rank], starts[src], causal, scale)   # ...then compute
        out, lse = merge_partials(out, lse, o_b, lse_b)
        if receive is not None:
            kv = receive()
    return AttentionResult(out, lse, None)


@torch.no_grad()
def ring_attention_local(q, k, v, *, causal=False, scale=None, group=None):
    """One rank's share of ring attention, inside an initialised process group
    (chapter 12).

    Rank r passes its own query, key and value blocks (global positions after those of
    ranks 0 .. r - 1; block lengths may differ and are exchanged first).
    Args: q ``(B, H, t_r, D)``, k ``(B, H, t_r, D)``, v ``(B, H, t_r, Dv)``;
    ``causal`` top-left over global positions;
    ``group``: the process group (default: the world). Returns :class:`AttentionResult`
    ``(out (B, H, t_r, Dv), lse (B, H, t_r), None)`` for this rank's queries.
    """
    import torch.distributed as dist
    fn = "ring_attention_local"
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{fn}: needs an initialised torch.distributed process "
                           f"group (dist.init_process_group); use ring_attention for "
                           f"local processes")
    scale, causal = _check_qkv(q, k, v, scale, causal, fn)
    rank, p = dist.get_rank(group), dist.get_world_size(group)
    shape = torch.tensor([*q.shape[:3], q.shape[3], v.shape[3]])     # B, H, t, D, Dv
    shapes = [torch.zeros_like(shape) for _ in range(p)]
    dist.all_gather(shapes, shape, group=group)
    for r, other in enumerate(shapes):
        if not torch.equal(other[[0, 1, 3, 4]], shape[[0, 1, 3, 4]]):
            raise ValueError(f"{fn}: rank {r} has (B, H, D, Dv) = "
                             f"{other[[0, 1, 3, 4]].tolist()}, "
                             f"rank {rank} has {shape[[0, 1, 3, 4]].tolist()}")
    lengths = [int(s[2]) for s in shapes]

    def peer(r):                                        # group rank -> global rank
        return r if group is None else dist.get_global_rank(group, r)
    nxt, prv = peer((rank + 1) % p), peer((rank - 1) % p)

    def pass_on(kv, s):
        buf = kv.new_empty(*kv.shape[:2], lengths[(rank - s - 1) % p], kv.shape[3])
        ops = [dist.P2POp(dist.isend, kv, nxt, group),
               dist.P2POp(dist.irecv, buf, prv, group)]
        works = dist.batch_isend_irecv(ops)

        def receive():
            for w in works:
                w.wait()
            return buf
        return receive

    kv = torch.cat([k, v], -1).contiguous()            # one message per step: [K | V]
    return _ring_loop(q, kv, q.shape[-1], rank, lengths, causal, scale, pass_on)


@torch.no_grad()
def ring_attention_simulated(q, k, v, *, world_size=2, causal=False, scale=None):
    """Ring attention with every rank's loop run in this process (chapter 12).

    The key/value block rank r receives at step s is the one rank r - 1 held at step s,
    i.e. rank (r - s - 1) mod P's: the list of blocks stands in for the network, and the loop
    is :func:`ring_attention_local`'s. Args and result as :func:`ring_attention`.
    """
    scale, causal, world_size = _check_entry(q, k, v, world_size, causal, scale,
                                             "ring_attention_simulated")
    lengths = split_lengths(q.shape[2], world_size)
    qs, ks, vs = (t.split(lengths, dim=2) for t in (q, k, v))
    kvs = [torch.cat([kb, vb], -1) for kb, vb in zip(ks, vs)]
    outs = []
    for r in range(world_size):
        def pass_on(kv, s, r=r):
            return lambda: kvs[(r - s - 1) % world_size]
        outs.append(_ring_loop(qs[r], kvs[r], q.shape[-1], r, lengths, causal, scale, pass_on).out)
    return torch.cat(outs, 2)                                 # (B, H, T, Dv)


def _launch(rank, fn, world_size, port, timeout, args):
    """One spawned process: join the gloo group, run ``fn(rank, world_size, *args)``, leave."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout))
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    except RuntimeError as e:
        if _peer_lost(e):  # another rank failed first: let its error be the one reported
            time.sleep(_PEER_LOST_WAIT)
        raise
    finally:
        dist.destroy_process_group()


_PEER_LOST_WAIT = 2.0  # seconds: the failed rank exits first, so run_local names it


def _peer_lost(e: BaseException) -> bool:
    """Is ``e`` gloo reporting that a peer went away (a consequence, not the cause)?"""
    text = str(e)
    return any(s in text for s in ("Connection reset by peer", "Connection closed by peer",
                                   "Read error", "Broken pipe", "Socket closed"))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(fn, world_size, *args, timeout=60.0, caller="run_local") -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned local processes joined in
    one gloo process group (127.0.0.1, a free port) (chapter 12).

    ``fn`` must be importable by name (a module-level function); tensors in ``args`` made with
    ``share_memory_()`` are shared, so a rank can write its results into them. The processes
    are always joined, or terminated when one fails; a failure in a rank is raised here as a
    RuntimeError that names the rank and carries its traceback and message. ``caller`` names
    the public function in those messages.
    """
    import torch.distributed as dist
    import torch.multiprocessing as mp
    world_size = check_int("world_size", world_size, fn=caller)
    timeout = check_float("timeout", timeout, fn=caller, minimum=0.0, inclusive=False)
    if not callable(fn):
        raise TypeError(f"{caller}: `fn` must be a callable, got {type(fn).__name__}")
    if not (dist.is_available() and dist.is_gloo_available()):
        raise RuntimeError(f"{caller}: this PyTorch build has no torch.distributed gloo backend")
    try:
        mp.start_processes(_launch, args=(fn, world_size, _free_port(), timeout, args),
                           nprocs=world_size, join=True, start_method="spawn")
    except mp.ProcessRaisedException as e:
        raise RuntimeError(f"{caller}: rank {e.error_index} failed:\n{e}") from None
    except mp.ProcessExitedException as e:
        raise RuntimeError(f"{caller}: rank {e.error_index} exited with code "
                           f"{e.exit_code}") from None
    except (OSError, pickle.PicklingError, AttributeError) as e:
        raise RuntimeError(f"{caller}: cannot start {world_size} local processes on this platform "
                           f"({type(e).__name__}: {e}); ring_attention_simulated runs the same "
                           f"loop in one process") from e


def _ring_job(rank, world_size, q, k, v, causal, scale, out):
    """One rank of :func:`ring_attention`: its block of q, k, v in, its rows of ``out`` out."""
    lengths = split_lengths(q.shape[2], world_size)
    a = sum(lengths[:rank])
    sl = slice(a, a + lengths[rank])                          # this rank's positions
    res = ring_attention_local(q[:, :, sl], k[:, :, sl], v[:, :, sl], causal=causal, scale=scale)
    out[:, :, sl] = res.out


def ring_attention(q, k, v, *, world_size=2, causal=False, scale=None, timeout=60.0):
    """Exact attention computed by ``world_size`` local processes passing key/value blocks
    round a ring (chapter 12).

    Starts ``world_size`` processes with :func:`run_local` (gloo on 127.0.0.1); each runs
    :func:`ring_attention_local` on its block and writes its rows of a shared output. The
    processes are always joined or terminated, also when one fails; a failure in a rank is
    raised here as a RuntimeError carrying that rank's message.

    Args: q, k ``(B, H, T, D)``, v ``(B, H, T, Dv)`` on the CPU; ``world_size`` P (1 <= P <= T);
    ``causal``: key j > query i hidden; ``scale``: default ``1/sqrt(D)``; ``timeout``: seconds
    a rank waits for the others. Returns ``out`` ``(B, H, T, Dv)``.
    """
    fn = "ring_attention"
    scale, causal, world_size = _check_entry(q, k, v, world_size, causal, scale, fn)
    if q.device.type != "cpu":
        raise ValueError(f"{fn}: the local processes use the gloo backend on the CPU; got tensors "
                         f"on {q.device} (on GPUs run ring_attention_local under torchrun, NCCL)")
    shared = [t.detach().clone().share_memory_() for t in (q, k, v)]
    out = q.new_zeros(*q.shape[:3], v.shape[3]).share_memory_()
    run_local(_ring_job, world_size, *shared, causal, scale, out, timeout=timeout, caller=fn)
    return out


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------

def _check_qkv(q, k, v, scale, causal, fn):
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, fn=fn, min_ndim=4)
        if t.ndim != 4:
            raise ValueError(f"{fn}: `{name}` must be (B, H, T, D), got shape {tuple(t.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{fn}: q and k must cover the same positions (T), got q {tuple(q.shape)} "
                         f"and k {tuple(k.shape)}")
    scale = check_attention_args(q, k, v, None, scale, fn=fn)
    return scale, check_bool("causal", causal, fn=fn)


def _check_entry(q, k, v, world_size, causal, scale, fn):
    scale, causal = _check_qkv(q, k, v, scale, causal, fn)
    world_size = check_int("world_size", world_size, fn=fn)
    if world_size > q.shape[2]:
        raise ValueError(f"{fn}: `world_size` must be <= T = {q.shape[2]} (every rank holds at "
                         f"least one position), got {world_size}")
    return scale, causal, world_size
