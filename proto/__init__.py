"""Wire contract (fleet.proto) and its generated modules; arrives with the live-FL issue."""
