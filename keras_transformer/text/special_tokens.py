"""Reserved token ids shared by every tokenizer, the data pipeline and decoding."""

# Padding: batches are padded with it and the model masks it out.
PAD_ID = 0
# Start of sequence (`<s>`): first decoder input token.
START_ID = 1
# End of sequence (`</s>`): last source token and last label; decoding stops at it.
END_ID = 2
# Unknown piece (`<unk>`); rare with byte fallback.
UNK_ID = 3
