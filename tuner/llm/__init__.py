"""A model writes and revises skeletons: the chat client (client), prompts, the skeleton writer
(proposer), the search's feedback (feedback) and the rounds loop (rounds)."""
