"""Edge agent: the program on each device (joins, pulls a round, trains, uploads), its deadline rule
(deadline.py) and its local trainer, which the simulator shares."""
