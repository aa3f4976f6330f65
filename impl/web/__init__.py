"""The web UI's static files: one page, one script, one stylesheet (REQ-003 GEN-02, SEC-40)."""
