"""The team's cluster stood up on this machine: hosts, stand-ins for cloud commands, the guides' text."""
