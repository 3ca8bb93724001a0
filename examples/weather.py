# A script as a model would write it: fan out over a read-only tool, reduce, report once.
import asyncio

import tools

cities = ["Paris", "Oslo", "Lima", "Cairo", "Hanoi"]
readings = await asyncio.gather(*(tools.aio.get_weather(city=c) for c in cities))
warmest = max(zip(cities, readings, strict=True), key=lambda pair: pair[1]["temp"])
tools.send_report(text=f"Warmest of {len(cities)} cities: {warmest[0]} ({warmest[1]['temp']} C)")
print(f"checked {len(cities)} cities; warmest: {warmest[0]}")
