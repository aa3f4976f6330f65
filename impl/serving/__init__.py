"""The request paths: what they share lives here (admission, the slot, prompts, stops,
events, embeddings); chat/ and completions/ below it.
"""
