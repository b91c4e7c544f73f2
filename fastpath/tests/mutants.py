#!/usr/bin/env python3
# Mutation check of the fast path: applies one wrong line at a time to the program or
# the loader, runs the steering tests, restores the file, and prints which tests caught
# it. Usage: python3 fastpath/tests/mutants.py [index ...]. Every mutation must be CAUGHT.
import subprocess, sys, re
import os
root=os.path.dirname(os.path.abspath(__file__))+'/../'
C='bpf/steer.bpf.c'; L='src/lib.rs'
muts=[
 ("mask byte order swapped", C, "(__u32)(cid[9] ^ (__u8)(h & 0xff)) << 8) | (__u32)(cid[10] ^ (__u8)((h >> 8) & 0xff))", "(__u32)(cid[9] ^ (__u8)((h >> 8) & 0xff)) << 8) | (__u32)(cid[10] ^ (__u8)(h & 0xff))"),
 ("k0/k1 swapped (loader)", L, "v[8..16].copy_from_slice(&k0.to_ne_bytes());\n        v[16..24].copy_from_slice(&k1.to_ne_bytes());", "v[8..16].copy_from_slice(&k1.to_ne_bytes());\n        v[16..24].copy_from_slice(&k0.to_ne_bytes());"),
 ("sockarray index off by one (prog: idx = *v)", C, "idx = *v - 1;", "idx = *v;"),
 ("sockarray index off by one (loader: ids = idx)", L, "update(&self.ids, server_id as u32, &(idx + 1).to_ne_bytes())", "update(&self.ids, server_id as u32, &(idx).to_ne_bytes())"),
 ("per-CPU counters not summed (first CPU only)", L, "    Ok(vals\n        .iter()", "    Ok(vals\n        .iter().take(1)"),
 ("shard modulo wrong (hash % (n+1))", C, "shard = ctx->hash % n;", "shard = ctx->hash % (n + 1);"),
 ("shard always 0", C, "shard = ctx->hash % n;", "shard = 0;"),
 ("min short length 32 instead of 33", C, "#define MIN_SHORT_PAYLOAD (1 + CID_LEN + 20)", "#define MIN_SHORT_PAYLOAD (1 + CID_LEN + 19)"),
 ("fixed-bit check dropped", C, "if (!(buf[0] & 0x40) || len", "if (len"),
 ("cr==3 check dropped", C, "if (cr == CR_UNROUTABLE) {", "if (0) {"),
 ("siphash length byte 8 instead of 9", C, "((__u64)9 << 56)", "((__u64)8 << 56)"),
 ("siphash 1 compression round", C, "\tv3 ^= b0;\n\tSIPROUND;\n\tSIPROUND;", "\tv3 ^= b0;\n\tSIPROUND;"),
 ("by_cpu ignores the table (cpu % n)", C, "shard = s ? *s : cpu % n;", "shard = cpu % n;"),
 ("worker_fast slot not minus shards", C, "slot = idx - cfg->shard_count;", "slot = idx;"),
 ("failed worker select dropped, not sent to a shard", C, "\t\twhy = C_SELECT_FAILED;\n\t\tgoto shard;", "\t\tcount(C_SELECT_FAILED);\n\t\treturn SK_DROP;"),
 ("inactive generation not checked", C, "if (!g || !g->active) {", "if (!g) {"),
 ("no counter for long header", C, "\t\twhy = C_LONG_HEADER;", "\t\twhy = C_SHORT_PACKET;"),
 ("remove_worker leaves ids", L, "            update(&self.ids, server_id as u32, &0u32.to_ne_bytes())?;", ""),
 ("failed shard select passes without selection", C, "\tcount(C_SHARD_SELECT_FAILED);\n\treturn SK_DROP;\n}", "\tcount(C_SHARD_SELECT_FAILED);\n\treturn SK_PASS;\n}"),
 ("insert_worker does not reset worker_fast", L, "        self.worker_fast\n            .update_percpu(&slot.to_ne_bytes(), &zeros, MapFlags::ANY)\n            .map_err(map_err)?;\n", "let _ = &zeros;\n"),
]
only = sys.argv[1:] 
for i,(name,f,a,b) in enumerate(muts):
    if only and str(i) not in only: continue
    p=root+f; orig=open(p).read()
    assert orig.count(a)==1, name
    open(p,'w').write(orig.replace(a,b))
    try:
        r=subprocess.run(['cargo','test','-q','-p','quicdemux-fastpath','--test','steering'],cwd=root+'..',capture_output=True,text=True,timeout=300)
        out=r.stdout+r.stderr
        failed=re.findall(r'^    (\w+)$',out,re.M)
        status = 'CAUGHT by '+','.join(sorted(set(failed))) if r.returncode!=0 and failed else ('BUILD/OTHER FAIL rc=%d'%r.returncode if r.returncode else 'SURVIVED')
        if r.returncode!=0 and not failed: status += ' :: '+out[-300:].replace('\n',' | ')
    finally:
        open(p,'w').write(orig)
    print(f"{i:2} {name}: {status}", flush=True)
