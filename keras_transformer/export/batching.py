"""Translating sentences in length-sorted batches, whatever engine translates a batch:
`BatchTranslator`, the base of `ExportedTranslator` (a SavedModel) and
`CTranslate2Translator` (a CTranslate2 model). Plain Python: no TensorFlow here.
"""

import numbers

# Batches read ahead and sorted by length together (CTranslate2's `max_batch_size * 16`
# read buffer, Marian's maxi-batch): long enough to group similar lengths, short enough to
# stream output soon.
SORT_BUFFER_BATCHES = 16


# An item of `iter_lines("-", idle_seconds=...)`: the standard input paused. In the sentences
# of `translate_stream` it ends the read-ahead buffer: what was read is translated at once.
IDLE = object()


def check_sentence_list(sentences):
    """Refuses one string where a list of sentences is expected (a string is an iterable of
    characters, which would be translated one by one)."""
    if isinstance(sentences, (str, bytes)):
        raise TypeError(
            "Expected a list of sentences, got one "
            f"{type(sentences).__name__}: pass [sentence] to translate it alone."
        )


def as_bytes(sentence):
    """str -> UTF-8 bytes; bytes pass through untouched (the graph repairs invalid UTF-8)."""
    if isinstance(sentence, bytes):
        return sentence
    if isinstance(sentence, str):
        try:
            return sentence.encode("utf-8")
        except UnicodeEncodeError:
            # Lone surrogates (bytes that were not UTF-8, read with `surrogateescape` as a C
            # locale's `sys.stdin` does) become U+FFFD, as invalid bytes do in the graph.
            return "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c
                           for c in sentence).encode("utf-8")
    raise TypeError(f"Expected str or bytes sentences, got {type(sentence).__name__}.")


def check_positive_integer(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {name}={value!r}.")


def translate_by_length(sentences, batch_size, translate_batch, on_batch=None):
    """Translates `sentences` in batches of similar length; results in input order.

    Args:
        sentences: list of str or bytes, sorted by `len` into batches (less padding).
        batch_size: int, sentences per call of `translate_batch`.
        translate_batch: callable, list of sentences -> list of results, one per sentence.
        on_batch: callable or None, called with the size of each batch once it is done.

    Returns:
        A list of results, `results[i]` for `sentences[i]`.

    Example:

    >>> translate_by_length(["ccc", "a", "bb"], 2, lambda batch: [s.upper() for s in batch])
    ['CCC', 'A', 'BB']
    """
    check_positive_integer("batch_size", batch_size)
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    results = [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        for index, result in zip(indices, translate_batch([sentences[i] for i in indices])):
            results[index] = result
        if on_batch is not None:
            on_batch(len(indices))
    return results


class BatchTranslator:
    """Sentences in, one result dict per sentence out, in length-sorted batches: what
    `ExportedTranslator` (a SavedModel) and `CTranslate2Translator` (a CTranslate2 model)
    share. A subclass implements `_translate_batch(list of UTF-8 bytes) -> list of dicts`."""

    def translate(self, sentences, batch_size=64, sort_buffer_batches=SORT_BUFFER_BATCHES,
                  on_batch=None):
        """Translates sentences in length-sorted batches of `batch_size`.

        Args:
            sentences: iterable of str (or UTF-8 bytes; invalid bytes are replaced in the
                graph).
            batch_size: int, sentences per signature call. Defaults to `64`.
            sort_buffer_batches: int, batches read ahead and sorted by length together (see
                `translate_stream`). Defaults to `SORT_BUFFER_BATCHES`.
            on_batch: callable or None, called with the number of sentences of each batch
                once it is translated (a progress bar). Defaults to `None`.

        Returns:
            A list with one dict per sentence, in order: `{"translation": str, "score":
            float (log-probability of the translation), "truncated": bool (the source was
            cut to the export's `max_input_length`), "unfinished": bool (the translation
            reached its length limit before its end), "length": int (target tokens, END
            included)}`.
        """
        return list(self.translate_stream(sentences, batch_size, sort_buffer_batches, on_batch))

    def translate_stream(self, sentences, batch_size=64,
                         sort_buffer_batches=SORT_BUFFER_BATCHES, on_batch=None):
        """Translates an iterable of sentences lazily, yielding results in input order.

        As CTranslate2's `translate_iterable` and Marian's maxi-batches do: reads
        `batch_size * sort_buffer_batches` sentences, sorts them by length (UTF-8 bytes, a
        cheap stand-in for tokens) so each batch pads little, translates the buffer batch by
        batch, yields its results in the original order, then reads the next buffer. The
        first translations come out after one buffer, not after the whole input; a
        sentence's translation does not depend on the others in its batch (except in an
        export with both `--dtype bfloat16` and `--jit`: export/README.md).

        Args:
            sentences: iterable of str or bytes (a file or stdin is read as it goes); an
                `IDLE` item (`iter_lines("-", idle_seconds=...)`: the input paused) has
                the sentences read so far translated at once.
            batch_size: int, sentences per signature call. Defaults to `64`.
            sort_buffer_batches: int, batches read ahead and sorted together; `1` translates
                in input order. Defaults to `SORT_BUFFER_BATCHES`.
            on_batch: callable or None, called with the batch size after each batch.

        Returns:
            An iterator of one dict per sentence, in order, as in `translate` (the
            arguments are checked by the call, the sentences translated as it is read).
        """
        # Checked now: a generator's body would run at the first result asked for.
        check_sentence_list(sentences)
        check_positive_integer("batch_size", batch_size)
        check_positive_integer("sort_buffer_batches", sort_buffer_batches)
        return self._stream(iter(sentences), batch_size, batch_size * sort_buffer_batches,
                            on_batch)

    def _stream(self, iterator, batch_size, buffer_size, on_batch):
        ended = False
        while not ended:
            buffer = []
            for sentence in iterator:
                if sentence is IDLE:  # the input paused: translate what it gave
                    if buffer:
                        break
                    continue
                buffer.append(as_bytes(sentence))
                if len(buffer) == buffer_size:
                    break
            else:
                ended = True
            if buffer:
                yield from translate_by_length(buffer, batch_size, self._translate_batch,
                                               on_batch)

    def _translate_batch(self, batch):
        raise NotImplementedError

    def __call__(self, sentences, batch_size=64):
        """Translates sentences; returns only the translations, a list of str."""
        return [r["translation"] for r in self.translate(sentences, batch_size=batch_size)]
