"""The hardware planner: measure this machine, price a model on it, propose settings
(REQ-003 PLAN, APPLY, LOAD-09..11)."""
