/*
 * Work units of about equal cost (sdpa.h): the forward and the backward
 * pass describe their items, sequence by sequence, and this cuts them into
 * runs. attn_parallel_for then deals the units out as contiguous shares
 * that are equal in work because the units are, and a worker that runs
 * out early takes from the others: one long sequence among many short
 * ones keeps every thread busy, and a thousand one-row sequences cost a
 * few hundred dispatches, not a thousand.
 */
#include "sdpa.h"

/* Whole sequences are taken at once while they fit under the share; a
 * sequence in which a cut falls is walked item by item. So the plan costs
 * O(sequences + the items of the sequences cut), and a cut sequence is
 * one whose items are large. */
double attn_units_plan(const sdpa_work *w, sdpa_units *u)
{
    double total = 0.0;
    for (int64_t s = 0; s < w->seqs; s++)
        total += w->seq_costs != NULL ? w->seq_costs[s] : w->seq_cost(w->ctx, s);
    double share = total / SDPA_UNITS_MAX;
    if (share < SDPA_UNIT_MIN_COST)
        share = SDPA_UNIT_MIN_COST;
    u->count = 0;
    u->start[0] = (sdpa_item_at){0, 0};
    double run = 0.0; /* cost of the unit being filled */
    for (int64_t s = 0; s < w->seqs; s++) {
        double whole = w->seq_costs != NULL ? w->seq_costs[s] : w->seq_cost(w->ctx, s);
        if (run + whole < share || u->count + 1 >= SDPA_UNITS_MAX) {
            run += whole;
            continue;
        }
        const int64_t items = w->items(w->ctx, s);
        for (int64_t i = 0; i < items; i++) {
            run += w->cost(w->ctx, s, i);
            if (run >= share && u->count + 1 < SDPA_UNITS_MAX) {
                u->start[++u->count] = (sdpa_item_at){s, i + 1};
                run = 0.0;
            }
        }
    }
    /* The last unit ends with the work; a cut that fell at the very end
     * is that end rather than an empty unit after it. */
    if (run > 0.0 || u->count == 0)
        u->count++;
    u->start[u->count] = (sdpa_item_at){w->seqs, 0};
    return total;
}

void attn_unit_items(const sdpa_work *w, const sdpa_units *u, int64_t unit,
                     void (*fn)(void *ctx, int64_t s, int64_t i), void *ctx)
{
    const sdpa_item_at end = u->start[unit + 1];
    int64_t s = u->start[unit].s, i = u->start[unit].i;
    int64_t items = s < w->seqs ? w->items(w->ctx, s) : 0;
    while (s < end.s || (s == end.s && i < end.i)) {
        if (i >= items) {
            s++;
            i = 0;
            items = s < w->seqs ? w->items(w->ctx, s) : 0;
            continue;
        }
        fn(ctx, s, i);
        i++;
    }
}
