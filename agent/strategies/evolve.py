"""evolve: a MAP-Elites archive split into islands, with migration (OpenEvolve, AVO, KernelEvolve).

Archive. Every verified attempt has a cell: its behaviour descriptors joined (agent.strategies.descriptors:
language | memory- or compute-bound | speed-of-light quarter | occupancy quarter, else registers, else the warps
tunable | template). Each island keeps, per cell, its elite: the fittest attempt in that cell (efficiency, ties to
the earlier attempt). Attempts are folded in number order, each into the island it was picked for (logged in
attempts.island), so the archive is a pure function of the logged attempts.

Islands and migration. There are `islands` islands (default 2); attempt t of branch b belongs to island
(b + t - 1) mod islands, so one branch visits the islands in turn and several branches spread over them. After
every `migrate_every` attempts of the run (default 4), each island's best elite is copied into the next island
(a ring), where it takes its cell if it is fitter than the cell's elite.

Parent selection, with one draw r from the attempt's seeded stream:
- r < 0.1 (explore): a uniformly random elite of the whole archive (any island);
- r < 0.3 (diversity): a uniformly random elite of the attempt's island;
- otherwise (exploit): the island's best elite, ties to the one with the fewest children, then the earlier attempt.
An empty island takes the archive's best elite; an empty archive (nothing verified yet) the branch's latest attempt.
The proposal sees the parent and up to 2 other elites of the island (inspirations, fittest first)."""
from __future__ import annotations

import random

from agent.strategies import Archive, Parent, cell_of, efficiency, fitness_key
from tools.records.store import Attempt

EXPLORE = 0.1
DIVERSITY = 0.2
INSPIRATIONS = 2


def island_of(archive: Archive, branch: int, turn: int) -> int:
    return (branch + turn - 1) % archive.islands


def build_islands(archive: Archive) -> list[dict[str, Attempt]]:
    """Per island, cell -> elite attempt, after folding every logged attempt and every migration in order."""
    islands: list[dict[str, Attempt]] = [{} for _ in range(archive.islands)]
    cells: dict[int, str | None] = {}

    def cell(row: Attempt) -> str | None:
        if row.id not in cells:
            cells[row.id] = cell_of(row)
        return cells[row.id]

    def place(island: dict, row: Attempt) -> None:
        c = cell(row)
        if c is not None and (c not in island or fitness_key(row) > fitness_key(island[c])):
            island[c] = row

    for row in archive.attempts:
        if row.verdict == "correct":
            home = row.island
            home = row.branch if home is None else home
            place(islands[home % archive.islands], row)
        if archive.islands > 1 and row.number % archive.migrate_every == 0:
            migrants = [max(island.values(), key=fitness_key) if island else None for island in islands]
            for i, migrant in enumerate(migrants):
                if migrant is not None:
                    place(islands[(i + 1) % archive.islands], migrant)
    return islands


class Evolve:
    name = "evolve"

    def pick(self, archive: Archive, rng: random.Random, branch: int, turn: int) -> Parent:
        islands = build_islands(archive)
        home = island_of(archive, branch, turn)
        mine = sorted(islands[home].values(), key=lambda r: r.number)
        everyone = sorted({r.id: r for island in islands for r in island.values()}.values(),
                          key=lambda r: r.number)
        r = rng.random()
        if not everyone:
            parent = archive.fallback(branch, self.name)
            parent.island = home
            return parent
        if not mine:
            chosen, why = max(everyone, key=fitness_key), f"island {home} is empty: the archive's best elite"
        elif r < EXPLORE:
            chosen, why = rng.choice(everyone), "explore: a random elite of the whole archive"
        elif r < EXPLORE + DIVERSITY:
            chosen, why = rng.choice(mine), f"diversity: a random elite of island {home}"
        else:
            chosen = max(mine, key=lambda a: (efficiency(a), -archive.children.get(a.id, 0), -a.number))
            why = f"exploit: island {home}'s best elite"
        cell = cell_of(chosen)
        others = sorted((a for a in mine if a.id != chosen.id), key=fitness_key, reverse=True)[:INSPIRATIONS]
        return Parent(chosen, f"evolve: {why}, attempt #{chosen.number} in cell {cell} "
                              f"({len(islands[home])} cells on island {home}, {len(everyone)} elites in all)",
                      cell=cell, island=home, shown=others + [chosen])


STRATEGY = Evolve()
