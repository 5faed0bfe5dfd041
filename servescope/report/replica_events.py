"""The replica model's event loop (servescope/report/replicas.py says the model), over arrays, compiled with numba where installed.

Why compiled and not numpy-vectorised: least-connections routing makes every arrival depend on the state the ones
before it left, so the loop is sequential by nature; numpy cannot batch it, and a Python loop ran 2,000,000 arrivals in
minutes. numba compiles this very source (plain Python over numpy arrays) to machine code; without numba the same
function runs as Python (the result is the same, only slower), so there is one source of the model's rules.

Why it always ends: every turn of the loop consumes an arrival, a request's first token or a request's completion,
and a request has one of each: at most 3 turns a request, whatever the times (a zero time per token, or a step too
small to move a clock of 6e5 s, completes the request at the event it was scheduled for instead of trying again).

Costs: a replica's turn costs the requests it holds while within its measured levels (the model's pace differs per
level and per request); above its highest level every request's pace is that level's times k / top, one factor for
all, so a virtual clock and a heap make its turns O(log k) however far it is overloaded. Routing and the next event
over replicas are trees: O(log replicas).
"""

from __future__ import annotations

import math

import numpy as np

INF = math.inf
HUGE = 1.0e300  # a finite stand-in for "never" where a tree compares times
LEVEL, BEYOND = 0, 1  # a replica's regime: within its measured levels, or above its highest
OK, ERR_BEYOND, ERR_FAILED = 0, 1, 2  # an outcome's error code


def _level_index(conc, k):
    """The lowest measured level at or above k requests in flight; -1 above the highest."""
    lo, hi = 0, conc.shape[0]
    x = k - 1e-9
    while lo < hi:
        mid = (lo + hi) // 2
        if conc[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < conc.shape[0] else -1


def _quantile(values, offsets, level, u):
    """The level's value at quantile u (a level with no value: 0, the request takes no time there)."""
    start, n = offsets[level], offsets[level + 1] - offsets[level]
    if n <= 0:
        return 0.0
    i = int(u * n)
    if i > n - 1:
        i = n - 1
    if i < 0:
        i = 0
    return values[start + i]


def _tree_set(tree, keys, size, j):
    """Winner tree over replicas: the one with the smallest key (ties: the lower index) rises to tree[1]."""
    node = (size + j) // 2
    while node >= 1:
        a, b = tree[2 * node], tree[2 * node + 1]
        if a < 0:
            tree[node] = b
        elif b < 0:
            tree[node] = a
        elif keys[b] < keys[a]:
            tree[node] = b
        else:
            tree[node] = a
        node //= 2


def _load_set(lmin, lcnt, size, j, load):
    """The least-connections tree: each node the fewest requests under it and how many replicas hold that few."""
    node = size + j
    lmin[node] = load
    lcnt[node] = 1
    node //= 2
    while node >= 1:
        a, b = 2 * node, 2 * node + 1
        if lmin[a] < lmin[b]:
            lmin[node], lcnt[node] = lmin[a], lcnt[a]
        elif lmin[b] < lmin[a]:
            lmin[node], lcnt[node] = lmin[b], lcnt[b]
        else:
            lmin[node], lcnt[node] = lmin[a], lcnt[a] + lcnt[b]
        node //= 2


def _least_conn(lmin, lcnt, size, turn):
    """The replica least_conn picks: of those holding the fewest requests, in index order, the turn-th (mod how
    many): nginx's ties taken in turn. nginx keeps a weight per peer (smooth weighted round robin over the tied
    ones); one turn for all is the same for two replicas and an approximation for more."""
    fewest = lmin[1]
    j = turn % lcnt[1]
    node = 1
    while node < size:
        a = 2 * node
        if lmin[a] == fewest:
            if j < lcnt[a]:
                node = a
                continue
            j -= lcnt[a]
        node = a + 1
    return node - size


def _heap_push(keys, idx, size, key, i):
    """Push (key, i) on a binary min-heap held in keys/idx[0:size]; ties: the lower i first. Returns the new size."""
    pos = size
    while pos > 0:
        parent = (pos - 1) // 2
        pk, pi = keys[parent], idx[parent]
        if pk < key or (pk == key and pi < i):
            break
        keys[pos], idx[pos] = pk, pi
        pos = parent
    keys[pos], idx[pos] = key, i
    return size + 1


def _heap_pop(keys, idx, size):
    """Remove the top of the heap; returns the new size."""
    size -= 1
    if size <= 0:
        return 0
    key, i = keys[size], idx[size]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (keys[right] < keys[child] or (keys[right] == keys[child] and idx[right] < idx[child])):
            child = right
        ck, ci = keys[child], idx[child]
        if key < ck or (key == ck and i < ci):
            break
        keys[pos], idx[pos] = ck, ci
        pos = child
    keys[pos], idx[pos] = key, i
    return size


def _run(
    at,
    tokens,
    draws,
    replicas,
    round_robin,
    turn,
    slots,
    per_host,
    shared,
    conc,
    ttft_off,
    ttft_val,
    tpot_off,
    tpot_val,
    failed_share,
    busy_conc,
    busy_ttft_off,
    busy_ttft_val,
    busy_tpot_off,
    busy_tpot_val,
    busy_failed_share,
):
    """Every arrival's outcome: (replica, ttft_s, e2e_s, error code, level drawn from); NaN TTFT/E2E where it failed.
    `draws`: a row of quantiles a request (TTFT, time per token, failure).
    `level` numbers the own knee's levels from 0 and the busy knee's after them."""
    n = at.shape[0]
    n_own = conc.shape[0]
    tops = np.empty(2)
    tops[0], tops[1] = conc[n_own - 1], busy_conc[busy_conc.shape[0] - 1]
    # per request
    first_at = np.zeros(n)
    remaining = np.zeros(n)
    vfin = np.zeros(n)
    decoding = np.zeros(n, np.bool_)
    beyond = np.zeros(n, np.bool_)
    failed = np.zeros(n, np.bool_)
    fnext = np.full(n, -1, np.int32)  # int32: a plan holds at most a few million requests, and memory is its bound
    fprev = np.full(n, -1, np.int32)
    wnext = np.full(n, -1, np.int32)
    out_rep = np.full(n, -1, np.int32)
    out_ttft = np.full(n, np.nan)
    out_e2e = np.full(n, np.nan)
    out_err = np.zeros(n, np.int8)
    out_level = np.full(n, -1, np.int32)
    # per replica
    fhead = np.full(replicas, -1, np.int64)
    ftail = np.full(replicas, -1, np.int64)
    count = np.zeros(replicas, np.int64)
    whead = np.full(replicas, -1, np.int64)
    wtail = np.full(replicas, -1, np.int64)
    wcount = np.zeros(replicas, np.int64)
    last = np.zeros(replicas)
    prof = np.zeros(replicas, np.int64)
    mode = np.zeros(replicas, np.int64)
    vclock = np.zeros(replicas)
    nxt_t = np.full(replicas, HUGE)
    nxt_i = np.full(replicas, -1, np.int64)
    cap = 16
    hkey = np.zeros((replicas, cap))
    hidx = np.zeros((replicas, cap), np.int64)
    hsize = np.zeros(replicas, np.int64)
    # first tokens: fixed times once admitted, never cancelled
    ft_key = np.zeros(max(n, 1))
    ft_idx = np.zeros(max(n, 1), np.int32)
    ft_size = 0
    # trees over replicas
    size = 1
    while size < replicas:
        size *= 2
    ctree = np.full(2 * size, -1, np.int64)
    for j in range(replicas):
        ctree[size + j] = j
    for j in range(replicas):
        _tree_set(ctree, nxt_t, size, j)
    lmin = np.full(2 * size, 2**62, np.int64)  # padding leaves: never the fewest
    lcnt = np.zeros(2 * size, np.int64)
    for j in range(replicas):
        _load_set(lmin, lcnt, size, j, 0)
    arrival = 0

    while True:
        has_a = arrival < n
        has_f = ft_size > 0
        winner = ctree[1]
        has_c = winner >= 0 and nxt_i[winner] >= 0
        if not (has_a or has_f or has_c):
            break
        ta = at[arrival] if has_a else INF
        tf = ft_key[0] if has_f else INF
        tc = nxt_t[winner] if has_c else INF
        # Events at or before an arrival's instant come first (the state it meets); a first token before a completion
        # at the same instant (neither changes the other's outcome: no time passes between them).
        if has_f and not (has_c and tc < tf) and not (has_a and ta < tf):
            kind = 0
        elif has_c and not (has_a and ta < tc):
            kind = 1
        else:
            kind = 2

        if kind == 0:  # a first token: the request starts decoding
            i = ft_idx[0]
            now = tf
            ft_size = _heap_pop(ft_key, ft_idx, ft_size)
            r = out_rep[i]
            touched_lo, touched_hi = r, r + 1
        elif kind == 1:  # a completion
            r = winner
            i = nxt_i[r]
            now = tc
            first = r - r % per_host
            touched_lo, touched_hi = first, min(first + per_host, replicas)
        else:  # an arrival, routed at once
            i = arrival
            now = ta
            arrival += 1
            if round_robin:
                r = i % replicas
            else:
                r = _least_conn(lmin, lcnt, size, turn)
                if lcnt[1] > 1:  # nginx's turn moves on a tie only: one replica holding the fewest is no one's turn
                    turn += 1
            out_rep[i] = r
            first = r - r % per_host
            touched_lo, touched_hi = first, min(first + per_host, replicas)

        # Bring the replicas whose pace may change to `now` at the paces of the moment.
        for j in range(touched_lo, touched_hi):
            dt = now - last[j]
            if dt > 0 and count[j] > 0:
                p = prof[j]
                if mode[j] == BEYOND:
                    vclock[j] += dt * tops[p] / count[j]
                else:
                    c_, o_, v_ = (conc, tpot_off, tpot_val) if p == 0 else (busy_conc, busy_tpot_off, busy_tpot_val)
                    lv = _level_index(c_, count[j])
                    f = fhead[j]
                    while f >= 0:
                        if decoding[f] and remaining[f] > 0:
                            pace = _quantile(v_, o_, lv, draws[f, 1])
                            if pace > 0:
                                left = remaining[f] - dt / pace
                                remaining[f] = left if left > 0 else 0.0
                            else:
                                remaining[f] = 0.0
                        f = fnext[f]
            if now > last[j]:
                last[j] = now

        admit = -1
        if kind == 0:
            decoding[i] = True
            if mode[r] == BEYOND:
                p = prof[r]
                v_, o_ = (tpot_val, tpot_off) if p == 0 else (busy_tpot_val, busy_tpot_off)
                top_lv = (n_own if p == 0 else busy_conc.shape[0]) - 1
                if hsize[r] == cap:
                    cap *= 2
                    k2 = np.zeros((replicas, cap))
                    i2 = np.zeros((replicas, cap), np.int64)
                    k2[:, : cap // 2] = hkey
                    i2[:, : cap // 2] = hidx
                    hkey, hidx = k2, i2
                vfin[i] = vclock[r] + remaining[i] * _quantile(v_, o_, top_lv, draws[i, 1])
                hsize[r] = _heap_push(hkey[r], hidx[r], hsize[r], vfin[i], i)
        elif kind == 1:
            # The request ends here, at the instant it was scheduled for, whatever float rounding left of it.
            remaining[i] = 0.0
            if mode[r] == BEYOND:
                hsize[r] = _heap_pop(hkey[r], hidx[r], hsize[r])
            a, b = fprev[i], fnext[i]
            if a >= 0:
                fnext[a] = b
            else:
                fhead[r] = b
            if b >= 0:
                fprev[b] = a
            else:
                ftail[r] = a
            count[r] -= 1
            if beyond[i]:
                out_err[i] = ERR_BEYOND
            elif failed[i]:
                out_err[i] = ERR_FAILED
            if out_err[i] == OK:
                out_e2e[i] = now - at[i]
            else:
                out_ttft[i] = np.nan
            if wcount[r] > 0:
                admit = whead[r]
                whead[r] = wnext[admit]
                if whead[r] < 0:
                    wtail[r] = -1
                wcount[r] -= 1
        else:
            if slots >= 0 and count[r] >= slots:
                if wtail[r] >= 0:
                    wnext[wtail[r]] = i
                else:
                    whead[r] = i
                wtail[r] = i
                wcount[r] += 1
            else:
                admit = i

        if admit >= 0:  # at admission: TTFT and failure drawn from the level the replica then runs at
            p = prof[r]
            if p == 0:
                c_, to_, tv_, fs_ = conc, ttft_off, ttft_val, failed_share
            else:
                c_, to_, tv_, fs_ = busy_conc, busy_ttft_off, busy_ttft_val, busy_failed_share
            k = count[r] + 1
            lv = _level_index(c_, k)
            over = lv < 0
            measured = c_.shape[0] - 1 if over else lv
            ttft = _quantile(tv_, to_, measured, draws[admit, 0])
            if over:
                ttft *= k / tops[p]
            beyond[admit] = over
            failed[admit] = draws[admit, 2] < fs_[measured]
            first_at[admit] = now + ttft
            remaining[admit] = max(0, tokens[admit] - 1)
            out_ttft[admit] = now - at[admit] + ttft
            out_level[admit] = measured if p == 0 else n_own + measured
            if ftail[r] >= 0:
                fnext[ftail[r]] = admit
                fprev[admit] = ftail[r]
            else:
                fhead[r] = admit
            ftail[r] = admit
            count[r] += 1
            ft_size = _heap_push(ft_key, ft_idx, ft_size, first_at[admit], admit)

        if kind != 0:
            _load_set(lmin, lcnt, size, r, count[r] + wcount[r])

        # The touched replicas' regime (their knee, their level or above it) and next completion. They are on r's
        # machine: a neighbour is busy when the machine has more busy replicas than this one.
        busy_here = 0
        if shared:
            first = r - r % per_host
            for m in range(first, min(first + per_host, replicas)):
                if count[m] > 0:
                    busy_here += 1
        for j in range(touched_lo, touched_hi):
            p_new = 0
            if shared and busy_here - (1 if count[j] > 0 else 0) > 0:
                p_new = 1
            mode_new = BEYOND if count[j] - 1e-9 > tops[p_new] else LEVEL
            if p_new != prof[j] or mode_new != mode[j]:
                p = prof[j]
                v_, o_ = (tpot_val, tpot_off) if p == 0 else (busy_tpot_val, busy_tpot_off)
                top_lv = (n_own if p == 0 else busy_conc.shape[0]) - 1
                if mode[j] == BEYOND:  # each request's tokens left, from its virtual finish
                    f = fhead[j]
                    while f >= 0:
                        if decoding[f]:
                            pace = _quantile(v_, o_, top_lv, draws[f, 1])
                            left = vfin[f] - vclock[j]
                            remaining[f] = left / pace if pace > 0 and left > 0 else 0.0
                        f = fnext[f]
                    hsize[j] = 0
                if mode_new == BEYOND:
                    v_, o_ = (tpot_val, tpot_off) if p_new == 0 else (busy_tpot_val, busy_tpot_off)
                    top_lv = (n_own if p_new == 0 else busy_conc.shape[0]) - 1
                    vclock[j] = 0.0
                    f = fhead[j]
                    while f >= 0:
                        if decoding[f]:
                            if hsize[j] == cap:
                                cap *= 2
                                k2 = np.zeros((replicas, cap))
                                i2 = np.zeros((replicas, cap), np.int64)
                                k2[:, : cap // 2] = hkey
                                i2[:, : cap // 2] = hidx
                                hkey, hidx = k2, i2
                            vfin[f] = remaining[f] * _quantile(v_, o_, top_lv, draws[f, 1])
                            hsize[j] = _heap_push(hkey[j], hidx[j], hsize[j], vfin[f], f)
                        f = fnext[f]
                prof[j] = p_new
                mode[j] = mode_new
            best_t = HUGE
            best_i = -1
            if count[j] > 0:
                if mode[j] == BEYOND:
                    if hsize[j] > 0:
                        best_i = hidx[j, 0]
                        left = hkey[j, 0] - vclock[j]
                        best_t = last[j] + (left if left > 0 else 0.0) * count[j] / tops[prof[j]]
                else:
                    p = prof[j]
                    c_, o_, v_ = (conc, tpot_off, tpot_val) if p == 0 else (busy_conc, busy_tpot_off, busy_tpot_val)
                    lv = _level_index(c_, count[j])
                    f = fhead[j]
                    while f >= 0:
                        if decoding[f]:
                            t = last[j] + remaining[f] * _quantile(v_, o_, lv, draws[f, 1])
                            if best_i < 0 or t < best_t:
                                best_t, best_i = t, f
                        f = fnext[f]
            if best_t > HUGE:
                best_t = HUGE
            nxt_t[j] = best_t
            nxt_i[j] = best_i
            _tree_set(ctree, nxt_t, size, j)

    return out_rep, out_ttft, out_e2e, out_err, out_level


_compiled = None
_HELPERS = ("_level_index", "_quantile", "_tree_set", "_load_set", "_least_conn", "_heap_push", "_heap_pop")


def run(*args):
    """_run compiled (numba's cache keeps it across processes), on first use: numba is imported only by what runs the
    model, not by everything that imports the plan (the report, the stack's router)."""
    global _compiled
    if _compiled is None:
        _compiled = _compile()
    return _compiled(*args)


def _compile():
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; without it the same source runs as Python
        return _run
    here = globals()
    for name in _HELPERS:  # compiled before _run, which calls them: numba reads the module's globals as it compiles
        here[name] = numba.njit(cache=True, nogil=True)(here[name])
    return numba.njit(cache=True, nogil=True)(_run)
