/*
 * The notes a validated document keeps for its readers: for each long block
 * of a row of numbers that the validator classified (row_scan.c), where the
 * block starts and which of its bytes belong to numbers. The tensor reader
 * (number.c) then goes through the numbers of those blocks at once, from
 * the notes, without classifying the bytes a second time.
 *
 * Two arrays in text order, 12 bytes a block of 32 to 64 bytes, in one
 * allocation made at the first note for as many as the text could hold:
 * large ones are mapped by malloc and only the pages written are ever
 * touched, and nothing is copied or faulted in twice as a growing array
 * would be. Texts of 4 GiB and more are noted up to there only (the
 * offsets are 32-bit).
 */
#include "codec_internal.h"

#include <stdlib.h>

void codec_doc_note(codec_doc *doc, cursor p, uint64_t numbers)
{
    size_t at = (size_t)(p - doc->text);
    if (at > UINT32_MAX)
        return;
    if (!doc->block_numbers) {
        if (doc->block_cap) /* the allocation failed: no notes */
            return;
        /* every noted block takes CODEC_NOTE_MIN_LEN bytes of text or more */
        size_t cap = (size_t)(doc->end - doc->text) / CODEC_NOTE_MIN_LEN + 1;
        doc->block_cap = cap;
        doc->block_numbers = malloc(cap * (sizeof(uint64_t) + sizeof(uint32_t)));
        if (!doc->block_numbers)
            return;
        doc->block_at = (uint32_t *)(void *)(doc->block_numbers + cap);
    }
    if (doc->n_blocks == doc->block_cap) /* not on a validated text */
        return;
    doc->block_at[doc->n_blocks] = (uint32_t)at;
    doc->block_numbers[doc->n_blocks] = numbers;
    doc->n_blocks++;
}

void codec_doc_free(codec_doc *doc)
{
    free(doc->block_numbers); /* block_at lies in the same block */
    doc->block_at = NULL;
    doc->block_numbers = NULL;
    doc->n_blocks = doc->block_cap = 0;
}

void codec_notes_from(codec_notes *notes, const codec_doc *doc, cursor p)
{
    *notes = (codec_notes){.text = doc->text};
    if (!doc->n_blocks || p < doc->text)
        return;
    /* the first block at or after p: a binary search over the offsets */
    size_t at = (size_t)(p - doc->text), lo = 0, hi = doc->n_blocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (doc->block_at[mid] < at)
            lo = mid + 1;
        else
            hi = mid;
    }
    *notes = (codec_notes){.text = doc->text, .at = doc->block_at,
                           .numbers = doc->block_numbers, .i = lo, .n = doc->n_blocks};
}
