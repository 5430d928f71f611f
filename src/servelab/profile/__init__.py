"""WHERE the time goes (traces: steps, idle, categories, what-if) and the most any fix could win
(roofline ceilings of decode)."""
