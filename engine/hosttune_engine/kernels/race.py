"""Sampling under top-k or top-p without sorting the vocabulary: the exponential race, by rejection.

The sampler draws a row's token as the argmax of prob / noise (noise ~ Exp(1)) over the tokens the row
keeps. Ranked by probability (ties: lower id first), a row keeps a prefix: rank < top_k, and mass before
the token <= top_p. So the winner of the race over the whole row is kept, or everything ranked at or after
it is not, and the winner is then among the tokens ranked before it. Each round is one pass over the row:
it checks the candidate (the mass and count of the tokens ranked before it) and runs the race among those
tokens, the next candidate. The first token is always kept, so the rounds end; the expected number is
small (each new candidate falls about halfway up the prefix, by mass). A row that sets both top-k and
top-p takes its nucleus over the renormalized top k: the mass before a kept token is at most top_p times
the top k's mass, which needs the k-th largest prob, selected 8 bits of its fp32 pattern a pass (4 passes).
With the same noise, the token is the one that masking the sorted row and racing over what is left gives,
up to fp32 rounding of the mass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hosttune_engine.kernels.checks import check, check_last_dim_contiguous, check_tensor

MIN_TEMPERATURE = 1e-5  # the sampler's clamp: temperatures below it divide by it


@triton.jit
def _row_stats(logits, n_cols, t, BLOCK: tl.constexpr):
    """Max and sum of exp(x - max) of one row of logits / t, lane by lane (online), then combined."""
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    z_vec = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32) / t
        m_new = tl.maximum(m_vec, x)
        live = m_new > float("-inf")
        z_vec = tl.where(live, z_vec * tl.exp(m_vec - m_new) + tl.exp(x - m_new), 0.0)
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    z = tl.sum(tl.where(m_vec > float("-inf"), z_vec * tl.exp(m_vec - m), 0.0), axis=0)
    return m, z


@triton.jit
def _probs(logits, cols, inside, t, m, z):
    x = tl.load(logits + cols, mask=inside, other=float("-inf")).to(tl.float32) / t
    return tl.exp(x - m) / z


@triton.jit
def _top_k_mass(logits, n_cols, t, m, z, k, BLOCK: tl.constexpr):
    """The mass of the row's k most probable tokens. The k-th largest prob is selected by radix: a
    non-negative fp32's bit pattern orders like the number, so each pass fixes its next 8 bits, from a
    histogram of those bits over the tokens that match the bits fixed so far."""
    prefix = tl.zeros((), tl.int32)
    rank = k.to(tl.int32)  # the rank still to find among the tokens that match the prefix (1 = largest)
    bins = tl.arange(0, 512)  # digits 0-255; 256 takes the tokens that do not match
    for step in tl.static_range(4):
        shift = 24 - 8 * step
        hist = tl.zeros([512], tl.int32)
        for start in range(0, n_cols, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < n_cols
            bits = _probs(logits, cols, inside, t, m, z).to(tl.int32, bitcast=True)
            match = inside
            if step > 0:
                match = match & ((bits >> (shift + 8)) == (prefix >> (shift + 8)))
            hist += tl.histogram(tl.where(match, (bits >> shift) & 255, 256), 512)
        hist = tl.where(bins < 256, hist, 0)
        at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
        digit = tl.max(tl.where((bins < 256) & (at_or_above >= rank), bins, -1), axis=0)
        rank -= tl.sum(tl.where((bins > digit) & (bins < 256), hist, 0), axis=0)
        prefix = prefix | (digit << shift)
    kth = prefix.to(tl.float32, bitcast=True)
    mass = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        q = _probs(logits, cols, cols < n_cols, t, m, z)
        mass += tl.where(q > kth, q, 0.0)
    return tl.sum(mass, axis=0) + rank.to(tl.float32) * kth  # `rank` of the tokens tied at kth are in


@triton.jit
def _round(logits, noise, n_cols, t, m, z, qc, c, BLOCK: tl.constexpr):
    """Over the tokens ranked before the candidate (prob qc, id c): their mass, their count, and the winner
    of their race (its id, -1 if there are none, and its prob)."""
    mass = tl.zeros([BLOCK], tl.float32)
    count = tl.zeros([BLOCK], tl.int32)
    best = tl.full([BLOCK], -1.0, tl.float32)
    best_id = tl.full([BLOCK], -1, tl.int32)
    best_q = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        inside = cols < n_cols
        q = _probs(logits, cols, inside, t, m, z)
        e = tl.load(noise + cols, mask=inside, other=1.0)
        # `cols != c`: the candidate never races again, so each round moves up and the loop ends
        before = inside & (cols != c) & ((q > qc) | ((q == qc) & (cols < c)))
        mass += tl.where(before, q, 0.0)
        count += before.to(tl.int32)
        score = tl.where(before, q / e, -1.0)
        wins = score > best  # strict: a lane keeps its lowest id among equal scores
        best = tl.where(wins, score, best)
        best_id = tl.where(wins, cols, best_id)
        best_q = tl.where(wins, q, best_q)
    top = tl.max(best, axis=0)
    winner = tl.min(tl.where(best == top, best_id, n_cols), axis=0)  # the lowest id among equal scores
    winner_q = tl.max(tl.where(best_id == winner, best_q, -1.0), axis=0)
    return tl.sum(mass, axis=0), tl.sum(count, axis=0), tl.where(top >= 0.0, winner, -1), winner_q


@triton.jit
def _race_kernel(logits_ptr, noise_ptr, temp_ptr, top_k_ptr, top_p_ptr, out_ptr, stride_l, stride_e, n_cols,
                 MIN_T: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    logits = logits_ptr + row * stride_l
    noise = noise_ptr + row * stride_e
    t = tl.maximum(tl.load(temp_ptr + row), MIN_T)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    m, z = _row_stats(logits, n_cols, t, BLOCK)
    budget = top_p  # the mass before a kept token is at most this
    if (top_k < n_cols) & (top_p < 1.0):
        budget = top_p * _top_k_mass(logits, n_cols, t, m, z, top_k, BLOCK)
    # round 0: every token is ranked before a virtual candidate of prob -1, so this is the whole row's race
    _, _, c, qc = _round(logits, noise, n_cols, t, m, z, -1.0, n_cols, BLOCK)
    done = ((top_p >= 1.0) & (top_k >= n_cols)) | (c < 0)
    while done == 0:
        mass, count, nxt, q_nxt = _round(logits, noise, n_cols, t, m, z, qc, c, BLOCK)
        kept = ((mass <= budget) | (top_p >= 1.0)) & (count < top_k)
        done = kept | (nxt < 0)
        c = tl.where(done, c, nxt)
        qc = tl.where(done, qc, q_nxt)
    tl.store(out_ptr + row, tl.maximum(c, 0).to(tl.int64))


# (BLOCK, num_warps) by rows, from a sweep on the H200 (vocab 152K, top-p 0.95, ms): 4096/16 took 0.13 at 1
# row and 0.23 at 64 (2048/8: 0.22, 0.40); at 256 rows 2048/16 was best, 0.28 (2048/8: 0.45).
def launch_config(rows: int) -> tuple[int, int]:
    return (4096, 16) if rows <= 64 else (2048, 16)


def race_sample(logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                top_p: torch.Tensor, config: tuple[int, int] | None = None) -> torch.Tensor:
    """logits [N, V], noise [N, V] fp32 (Exp(1) draws), temperature, top_p [N] fp32, top_k [N] int (V or
    more: off) -> token ids [N] int64. Rows run as one program each; `config` (columns a program takes at a
    time, warps) overrides `launch_config` (tests, the benchmark's sweep)."""
    check_tensor("logits", logits, 2)
    check_tensor("noise", noise, 2, (torch.float32,), logits.device)
    check(noise.shape == logits.shape, "noise needs the shape of logits")
    check_last_dim_contiguous("logits", logits)
    check_last_dim_contiguous("noise", noise)
    n, vocab = logits.shape
    for name, t, dtypes in (("temperature", temperature, (torch.float32,)), ("top_p", top_p, (torch.float32,)),
                            ("top_k", top_k, (torch.int32, torch.int64))):
        check_tensor(name, t, 1, dtypes, logits.device)
        check(t.shape[0] == n, "temperature, top_k and top_p need one value per row of logits")
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n:
        block, warps = config or launch_config(n)
        _race_kernel[(n,)](logits, noise, temperature.contiguous(), top_k.contiguous(), top_p.contiguous(), out,
                           logits.stride(0), noise.stride(0), vocab, MIN_T=MIN_TEMPERATURE,
                           BLOCK=min(block, triton.next_power_of_2(vocab)), num_warps=warps)
    return out


def race_sample_ref(logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                    top_p: torch.Tensor) -> torch.Tensor:
    """The same rounds in torch ops, all rows at once (the CPU path, and the kernel's reference)."""
    probs = (logits.float() / temperature.clamp(min=MIN_TEMPERATURE)[:, None]).softmax(dim=-1)
    score = probs / noise
    vocab = logits.shape[-1]
    ids = torch.arange(vocab, device=logits.device)
    both = (top_k < vocab) & (top_p < 1.0)
    budget = torch.where(both, top_p * _top_k_mass_ref(probs, top_k), top_p) if bool(both.any()) else top_p
    c = score.argmax(dim=-1)
    done = (top_p >= 1.0) & (top_k >= vocab)
    while not bool(done.all()):
        qc = probs.gather(-1, c[:, None])
        before = (probs > qc) | ((probs == qc) & (ids[None, :] < c[:, None]))
        mass = torch.where(before, probs, 0.0).sum(dim=-1)
        kept = ((mass <= budget) | (top_p >= 1.0)) & (before.sum(dim=-1) < top_k)
        stop = done | kept | ~before.any(dim=-1)
        c = torch.where(stop, c, torch.where(before, score, -1.0).argmax(dim=-1))
        done = stop
    return c


def _top_k_mass_ref(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    k = top_k.clamp(max=probs.shape[-1])
    kth = probs.sort(dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])
    above = probs > kth
    return torch.where(above, probs, 0.0).sum(dim=-1) + (k - above.sum(dim=-1)) * kth[:, 0]
