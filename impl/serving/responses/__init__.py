"""OpenAI's Responses API on the chat path: requests, shapes, stored responses."""
