"""The web UI's static files: one page, its ES modules, one stylesheet (REQ-003 GEN-02, SEC-40)."""
