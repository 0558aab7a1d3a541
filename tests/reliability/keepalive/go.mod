module kvoffload/tests/reliability/keepalive

go 1.22
