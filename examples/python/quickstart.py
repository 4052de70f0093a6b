#!/usr/bin/env python3
"""Quarry's Python quickstart: a sandbox, a command, a session, a file, a
checkpoint. QUARRY_URL and QUARRY_API_KEY name the gateway (make run prints them)."""
import asyncio

from quarry import AsyncQuarry, Quarry


async def main() -> None:
    async with AsyncQuarry() as q:
        async with q.sandboxes.create(pool="default", labels={"example": "quickstart"}) as sb:
            r = await sb.exec("uname -a")
            print(r.exit_code, r.stdout.strip())
            async for ev in sb.exec_stream("for i in 1 2 3; do echo $i; sleep 0.1; done"):
                if ev.type == "stdout":
                    print("stream:", ev.data.strip())
            async with sb.session() as s:
                await s.run("cd /tmp && export GREETING=hi")
                print((await s.run("echo $GREETING from $PWD")).output.strip())
            await sb.files.write_text("notes.txt", "v1")
            ck = await sb.checkpoint(["notes.txt"])
            await sb.files.write_text("notes.txt", "v2")
            await sb.restore(ck)
            print("restored:", await sb.files.read_text("notes.txt"))
            await q.checkpoints.delete(ck)


def sync_main() -> None:
    with Quarry() as q, q.sandboxes.create() as sb:
        print(sb.exec("echo the sync client").stdout.strip())


if __name__ == "__main__":
    asyncio.run(main())
    sync_main()
