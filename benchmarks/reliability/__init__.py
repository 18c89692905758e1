"""Bad inputs through the CLI: each one's message and whether what was written survived (docs/reliability.md)."""
