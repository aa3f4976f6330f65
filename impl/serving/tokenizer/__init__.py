"""vLLM's tokenizer endpoints (issue 42): POST /v1/tokenize, POST /v1/detokenize and
GET /v1/tokenizer_info, also served at the root (`/tokenize`, http/aliases.py).

    asks.py     a tokenize body read, before any load: text, or the chat completion its
                `messages` would be, taken through that path's own steps
    info.py     what a model's tokenizer is, per engine
    service.py  the model (the loaded one, or loaded as /v1 loads it) and the answers

A chat is never rendered here: the engine renders it through the completion path's
`prompt_ids`, so its ids are a chat completion's (OAI-TOKIDS-01).
"""
