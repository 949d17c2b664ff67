"""torch's PowerSGD hook with its state kept so that a resumed run continues bit for bit.

torch keeps PowerSGD's memory per DDP bucket: each rank's error feedback (what compression
left out, added back next step) and the low-rank P and Q of every compressed gradient
(Q is reused as the next step's starting point). Bucket layouts are not stable: every DDP
run starts with one bucket and rebuilds them after its first step, so a resumed run's
first step sees another layout than the step it continues. Compression works per
parameter, so here the memory is moved between buckets by parameter name whenever the
layout a bucket arrives with differs from the one its memory was made for, and a
checkpoint stores it per parameter.

Q starts as a normal draw seeded by (--seed, parameter), the same on every rank, instead of
torch's draw per bucket, so its start is independent of the layout too.
"""
from collections import OrderedDict

from typing import Any, List, Optional

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from ..runtime import dist

MIN_COMPRESSION_RATE = 2  # torch's default: compress a gradient only if that at least halves it
# torch's default 0 turns a gradient with an all-zero column (a layer that got no signal this
# step) into NaN for the whole layer; 1e-8 is far below any column norm that carries signal.
ORTHOGONALIZATION_EPSILON = 1e-8


class PowerSGD:
    def __init__(self, module: torch.nn.Module, rank: int, warmup: int, seed: int):
        self.state = PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=warmup,
                                   min_compression_rate=MIN_COMPRESSION_RATE, use_error_feedback=True,
                                   warm_start=True, random_seed=seed,
                                   orthogonalization_epsilon=ORTHOGONALIZATION_EPSILON)  # pyright: ignore[reportArgumentType]  # torch leaves it unannotated with default 0, so the checker infers int; it is a float
        params = list(module.named_parameters())
        self.names = {id(p): name for name, p in params}
        self.order = {name: i for i, (name, _) in enumerate(params)}
        self.seed = seed
        self.layout = {}  # bucket index -> ((name, shape), ...) its memory in the state was made for
        self.pool = {}  # name -> {"error", "p", "q"}: memory waiting for its parameter's next bucket
        self.previous = None  # the last compressed bucket's future

    def hook(self, state, bucket):
        """torch's hook, one bucket after the other once compressing. Its second and third
        all-reduce start in completion callbacks, on gloo's threads: left alone, bucket k's P
        could reach gloo after bucket k+1's first all-reduce on one rank and before it on the
        other, and the ranks' collectives would no longer match ("Received data size doesn't
        match expected size")."""
        if state.iter < state.start_powerSGD_iter:
            return powerSGD_hook(state, bucket)  # plain all-reduce, launched in order by DDP
        buffer = bucket.buffer()  # a CUDA result needs a future that knows its device (stream sync)
        done = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        previous = self.previous

        def launch(_=None):
            try:
                self._arrange(bucket)
                powerSGD_hook(state, bucket).then(lambda f: _settle(done, f))
            except Exception as err:  # noqa: BLE001 (DDP raises it from the future)
                done.set_exception(err)
        self.previous = done
        if previous is None or previous.done():
            launch()
        else:
            previous.then(launch)
        return done

    def _arrange(self, bucket) -> None:
        """Give this bucket's index the memory of exactly this bucket's parameters."""
        index = bucket.index()
        layout = tuple((self.names[id(p)], tuple(p.shape)) for p in bucket.parameters())
        if self.layout.get(index) == layout:
            return
        # Earlier buckets of this step are in flight and already hold their new layouts, which
        # share no parameter with this one: only stale memory is moved.
        wanted = {name for name, _ in layout}
        for old in [i for i, held in self.layout.items()
                    if i == index or wanted & {name for name, _ in held}]:
            self._to_pool(old)
        buffer = bucket.buffer()
        pieces = [self._piece(name, shape) for name, shape in layout]
        s = self.state
        s.error_dict[index] = torch.cat([p["error"].reshape(-1) for p in pieces]).to(buffer)
        order = _compressed_order(layout, s.matrix_approximation_rank)
        s.p_memory_dict[index] = _cat([pieces[i]["p"] for i in order], buffer)
        s.q_memory_dict[index] = _cat([pieces[i]["q"] for i in order], buffer)
        self.layout[index] = layout

    def _to_pool(self, index: int) -> None:
        layout = self.layout.pop(index)
        s = self.state
        error = s.error_dict.pop(index).split([_numel(shape) for _, shape in layout])
        for (name, _), e in zip(layout, error):
            self.pool[name] = {"error": e, "p": None, "q": None}
        order = _compressed_order(layout, s.matrix_approximation_rank)
        ps = s.p_memory_dict.pop(index).split([_p_numel(layout[i][1], s.matrix_approximation_rank) for i in order])
        qs = s.q_memory_dict.pop(index).split([_q_numel(layout[i][1], s.matrix_approximation_rank) for i in order])
        for i, p, q in zip(order, ps, qs):
            self.pool[layout[i][0]].update(p=p, q=q)

    def _piece(self, name: str, shape: tuple) -> dict:
        """The parameter's memory from the pool, or a fresh start: zero error, and Q a seeded
        normal draw (the hook orthogonalises it; P is overwritten before it is read)."""
        piece = self.pool.pop(name, None) or {"error": torch.zeros(_numel(shape)), "p": None, "q": None}
        if piece["q"] is None:
            rank = self.state.matrix_approximation_rank
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.order[name])
            piece = {**piece, "p": torch.zeros(_p_numel(shape, rank)),
                     "q": torch.randn(_q_numel(shape, rank), generator=g)}
        return piece

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Every rank's memory per parameter, gathered on rank 0 (a collective)."""
        for index in list(self.layout):
            self._to_pool(index)  # the next step takes it back from the pool
        mine = {name: {k: (v.detach().cpu().clone() if v is not None else None) for k, v in piece.items()}
                for name, piece in self.pool.items()}
        ranks: Optional[List[Any]] = [None] * tdist.get_world_size() if tdist.get_rank() == 0 else None
        tdist.gather_object(mine, ranks, dst=0, group=dist.cpu_group())
        return {"name": "powersgd", "iter": self.state.iter, "rank": self.state.matrix_approximation_rank,
                "world_size": tdist.get_world_size(), "ranks": ranks}

    def load_state_dict(self, saved, say) -> None:
        if not saved or saved.get("name") != "powersgd":
            say(f"note: the checkpoint holds no PowerSGD state: PowerSGD starts afresh, after "
                f"{self.state.start_powerSGD_iter} steps of plain all-reduce")
            return
        self.state.iter = saved["iter"]
        world, rank = tdist.get_world_size(), tdist.get_rank()
        if saved["world_size"] == world:
            pool = saved["ranks"][rank]
        else:  # the mean error keeps the all-reduced sum of errors the same on any world size
            say(f"note: PowerSGD error feedback saved on {saved['world_size']} ranks continues on {world}: "
                "every rank starts from the ranks' mean error")
            pool = {name: {**piece, "error": torch.stack([r[name]["error"] for r in saved["ranks"]]).mean(0)}
                    for name, piece in saved["ranks"][0].items()}
        if saved["rank"] != self.state.matrix_approximation_rank:
            say(f"note: --powersgd-rank {self.state.matrix_approximation_rank} differs from the checkpoint's "
                f"{saved['rank']}: P and Q start afresh, the error feedback continues")
            pool = {name: {"error": piece["error"], "p": None, "q": None} for name, piece in pool.items()}
        self.pool = {name: piece for name, piece in pool.items() if name in self.order}
        self.layout = {}


def _settle(done, future) -> None:
    try:
        done.set_result(future.value())
    except Exception as err:  # noqa: BLE001
        done.set_exception(err)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _matrix(shape) -> tuple:
    return shape[0], _numel(shape) // shape[0]  # torch views each gradient as (shape[0], -1)


def _rank(shape, rank: int) -> int:
    n, m = _matrix(shape)
    return min(n, m, rank)


def _p_numel(shape, rank: int) -> int:
    return _matrix(shape)[0] * _rank(shape, rank)


def _q_numel(shape, rank: int) -> int:
    return _matrix(shape)[1] * _rank(shape, rank)


def compresses(shape, rank: int) -> bool:
    """powerSGD_hook's choice: compress when P and Q are at most 1/MIN_COMPRESSION_RATE of it."""
    n, m = _matrix(shape)
    return (n + m) * _rank(shape, rank) * MIN_COMPRESSION_RATE < n * m


def sent_numel(shape, rank: int) -> int:
    """Elements PowerSGD all-reduces for one gradient per step: P and Q, or the gradient itself."""
    return _p_numel(shape, rank) + _q_numel(shape, rank) if compresses(shape, rank) else _numel(shape)


def _compressed_order(layout, rank: int) -> list:
    """Positions of the compressed gradients in the order torch packs their P and Q: grouped
    by matrix shape, groups in order of first appearance (powerSGD_hook's shape_to_tensors)."""
    groups = OrderedDict()
    for i, (_, shape) in enumerate(layout):
        if compresses(shape, rank):
            groups.setdefault(_matrix(shape), []).append(i)
    return [i for members in groups.values() for i in members]


def _cat(parts, like: torch.Tensor) -> torch.Tensor:
    if not parts:
        return torch.empty(0, dtype=like.dtype, device=like.device)
    return torch.cat([p.reshape(-1) for p in parts]).to(device=like.device, dtype=like.dtype)
