#!/usr/bin/env python3
"""bench/fleet/placement.py: the fleet router's placement step over simulated nodes (issue 31,
"Measure": at least 100,000 decisions/s over 1,000 nodes, and image pulls cut by image
affinity against random placement on a skewed workload).

    python3 bench/fleet/placement.py [--nodes 1000] [--decisions 100000] [--step-decisions 5000] \
        [--repeats 7] [--images 2000] [--zipf 0.8,1.1,1.5] [--creates 200000] [--fill 0.5] \
        [--seed 1] [--profile]

Imports the router's real `place` and `NodeView` from python/lockbox/_router/placement.py, by path (the
module needs only the standard library, so neither Ray nor the built extension is needed).
The simulated fleet: --nodes nodes with capacities of 32, 64, 128 or 200 sandboxes (the
default `--max-sandboxes` is 64), loads drawn between empty and 90 % full, and each node
already holding a few of the images.

1. Decisions/s: --decisions calls of `place(eligible, image=..., rng=...)` on that fleet,
   images drawn from the skewed workload below. Variants: with an image (affinity looked
   at), without one (plain power of 3), the router's whole step as `Router._create` takes
   it without a placement hint (`place` over its list of nodes, with the image's holders from
   the index its probes keep), and with a hint (`eligible_nodes`, the routable nodes the hint
   names, and `holding`, those that hold the image, made anew per create: --step-decisions
   per repeat). Repeats are
   interleaved (A, B, C, A, B, C, ...) so a change in the machine's load hits every variant;
   median, min and max.
2. Image pulls: --creates creates whose images follow a Zipf law (each exponent of --zipf,
   over --images images: a few popular images, a long tail), on an empty fleet kept at --fill of
   its capacity (once there, each create is preceded by the departure of the oldest sandbox).
   A node pulls an image the first time it is sent a create for it, and keeps it (the
   router's view of a node's images only grows; a real node's store does not evict either).
   Policies: the router's `place` with the image (affinity: the K random nodes and up to
   HOLDERS nodes that already hold the image), the same over the K random nodes alone (as
   the router placed before it looked at holders), `place` without the image (power of 3
   alone), and uniformly random among the nodes with room. The simulation tells the router
   the node's images at once (the real router learns them from its next probe, within 1 s).

Prints Markdown tables. Asserts no timings.
"""
import argparse
import importlib.util
import itertools
import os
import random
import statistics
import sys
import time
from collections import deque

ROUTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "lockbox", "_router",
                      "placement.py")


def load_router():
    spec = importlib.util.spec_from_file_location("lockbox_router_bench", ROUTER)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def zipf_sampler(n, s, rng):
    """A function drawing image names by a Zipf law over n ranks (rank 1 most popular)."""
    weights = [1.0 / (r ** s) for r in range(1, n + 1)]
    cum = list(itertools.accumulate(weights))
    names = [f"registry.example/app-{r}:v1" for r in range(1, n + 1)]

    def draw():
        return rng.choices(names, cum_weights=cum)[0]

    def many(k):
        return rng.choices(names, cum_weights=cum, k=k)

    draw.many = many
    return draw, names


def fleet(router, n, rng, names, *, loaded=True, preheld=3):
    nodes = []
    for i in range(n):
        cap = rng.choice([32, 64, 128, 200])
        v = router.NodeView(f"node-{i:04d}", state="up", capacity=cap)
        if loaded:
            v.load = rng.randint(0, int(cap * 0.9))
            v.images = set(rng.sample(names[: len(names) // 4], preheld))
        nodes.append(v)
    return nodes


def decisions_per_second(router, nodes, images, variant, seed):
    rng = random.Random(seed)
    place, eligible_nodes, holding = router.place, router.eligible_nodes, router.holding
    t0 = time.perf_counter()
    if variant == "image":
        for img in images:
            place(nodes, image=img, rng=rng)
    elif variant == "plain":
        for _ in images:
            place(nodes, rng=rng)
    elif variant == "step":  # as Router._create without a hint: its node list and holders index, kept up to date
        index = {}
        for v in nodes:
            for img in v.images:
                index.setdefault(img, []).append(v)
        t0 = time.perf_counter()
        for img in images:
            place(nodes, image=img, rng=rng, holders=index.get(img, ()))
    else:  # as Router._create with a placement hint: the eligible nodes and holders made anew
        hint = {"labels": {}}
        for img in images:
            eligible = eligible_nodes(nodes, hint)
            place(eligible, image=img, rng=rng, holders=holding(eligible, img))
    return len(images) / (time.perf_counter() - t0)


def pulls(router, policy, args, zipf, seed):
    """Runs the create/departure workload under one policy; returns (pulls, busiest node's
    fill, mean node fill, distinct images pulled)."""
    rng = random.Random(seed)
    draw, names = zipf_sampler(args.images, zipf, random.Random(seed + 1))
    nodes = fleet(router, args.nodes, rng, names, loaded=False)
    total = sum(v.capacity for v in nodes)
    target = int(total * args.fill)
    live = deque()
    pulled = 0
    prng = random.Random(seed + 2)
    holders = {}
    for img in draw.many(args.creates):
        if len(live) >= target:
            live.popleft().load -= 1
        if policy == "affinity":
            # As the router: the K random nodes and up to HOLDERS that hold the image (kept in
            # an index here; the router scans its eligible list, `holding`).
            v = router.place(nodes, image=img, rng=prng, holders=holders.get(img, []))
        elif policy == "k-only":
            v = router.place(nodes, image=img, rng=prng)
        elif policy == "power-of-3":
            v = router.place(nodes, rng=prng)
        else:
            room = [n for n in nodes if n.load < n.capacity]
            v = prng.choice(room) if room else None
        if v is None:
            continue
        if img not in v.images:
            pulled += 1
            v.images.add(img)
            holders.setdefault(img, []).append(v)
        v.load += 1
        live.append(v)
    fills = [v.load / v.capacity for v in nodes]
    distinct = len({i for v in nodes for i in v.images})
    return pulled, max(fills), statistics.mean(fills), distinct


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--decisions", type=int, default=100_000)
    p.add_argument("--step-decisions", type=int, default=5000,
                   help="decisions per repeat of the step with a placement hint (it is far slower)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--zipf", default="0.8,1.1,1.5", help="Zipf exponents, comma-separated (the first also drives part 1)")
    p.add_argument("--creates", type=int, default=200_000)
    p.add_argument("--fill", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="also print cProfile's top entries (place alone, and the router's step)")
    a = p.parse_args()
    router = load_router()
    rng = random.Random(a.seed)
    exponents = [float(z) for z in a.zipf.split(",")]
    draw, names = zipf_sampler(a.images, exponents[0], rng)
    nodes = fleet(router, a.nodes, rng, names)
    images = draw.many(a.decisions)
    print(f"python {sys.version.split()[0]}, {a.nodes} nodes, {a.decisions} decisions per repeat, "
          f"{a.repeats} repeats interleaved; router K={router.K}, IMAGE_AFFINITY={router.IMAGE_AFFINITY}")
    print()
    variants = (("image", "`place` with an image (affinity)"), ("plain", "`place`, no image (power of 3 alone)"),
                ("step", "the router's whole step (no hint: node list + holders index + `place`)"),
                ("hinted", "the router's step with a placement hint (eligible list made per create)"))
    rates = {v: [] for v, _ in variants}
    for r in range(a.repeats):
        for v, _ in variants:
            some = images[: a.step_decisions] if v == "hinted" else images
            rates[v].append(decisions_per_second(router, nodes, some, v, a.seed + r))
    print(f"| over {a.nodes} nodes | decisions/s median | min | max | µs/decision (median) |")
    print("|---|---:|---:|---:|---:|")
    for v, label in variants:
        rs = rates[v]
        med = statistics.median(rs)
        print(f"| {label} | {med:,.0f} | {min(rs):,.0f} | {max(rs):,.0f} | {1e6 / med:.2f} |")
    print()
    if a.profile:
        import cProfile
        import pstats
        for variant, count in (("image", 20000), ("step", 20000), ("hinted", 2000)):
            count = min(count, len(images))
            prof = cProfile.Profile()
            prof.enable()
            decisions_per_second(router, nodes, images[:count], variant, a.seed)
            prof.disable()
            print(f"cProfile of {count} decisions, variant {variant!r}:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(6)

    print(f"Image pulls: {a.creates} creates over {a.images} images, fleet kept at {a.fill:.0%} "
          f"of its capacity (seed {a.seed})")
    print()
    print("| Zipf exponent | policy | pulls | random's pulls / these | busiest node's fill | mean node fill | images pulled |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for zipf in exponents:
        policies = (("random", "random (among nodes with room)"), ("power-of-3", "`place`, no image"),
                    ("k-only", "`place` with the image, K random nodes only"),
                    ("affinity", f"`place` with the image (the router: K random + {router.HOLDERS} holders)"))
        results = {pol: pulls(router, pol, a, zipf, a.seed) for pol, _ in policies}
        base = results["random"][0]
        for pol, label in policies:
            n, busiest, mean, distinct = results[pol]
            print(f"| {zipf} | {label} | {n:,} | {base / n:.2f}x | {busiest:.0%} | {mean:.0%} | {distinct:,} |")


if __name__ == "__main__":
    main()
