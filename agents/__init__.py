"""Search: planning, proposers (built-in rules and LLMs), tree search and the skill library."""
