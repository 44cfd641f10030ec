"""Edge agent: the deadline-aware local trainer that runs on each device."""
