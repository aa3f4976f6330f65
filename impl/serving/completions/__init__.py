"""The completion path: the typed request and its defaults, the prepared request (plan),
generation, scoring, and the OpenAI response shapes; `CompletionService` serves it.
"""
