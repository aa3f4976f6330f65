"""OpenAI's Batch API (issue 50): lines read one by one, run in the background, results kept."""
