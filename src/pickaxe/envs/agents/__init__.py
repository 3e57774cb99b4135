"""Multi-turn, tool-using LLM environments ("agents"): tools, the Python sandbox and the env."""
