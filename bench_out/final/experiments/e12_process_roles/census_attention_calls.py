# The census of README section 1, per attention call: run beside census_switch.py, switch.txt
# and tids.txt. Server pid 22815 (prefill thread 22842, OpenBLAS worker 22816), bench pid
# 22811 (main thread 22811, OpenBLAS worker 22865), read off tids.txt for that run.
import re,collections
exec(open('census_switch.py').read().split('SB,SV=')[0])
SB,SV=22811,22815
t0=min(i[1] for i in iv)
roles={SV:(22842,22816),SB:(22811,22865)}
by=collections.defaultdict(list)
for r in iv: by[r[0]].append(r)
for p,name in ((SV,'server'),(SB,'bench')):
    caller,worker=roles[p]
    helpers=[t for t in by if pid_of.get(t)==p and t not in (caller,worker,p) and sum(y-x for _,x,y,_ in by[t])>0.2]
    helpers.sort(key=lambda t: by[t][0][1])
    for t in helpers:
        a=by[t][0][1]; b=by[t][-1][2]
        def cpu(tid): return sum(max(0,min(y,b)-max(x,a)) for _,x,y,_ in by[tid])
        oth=0
        for tid,x,y,c in iv:
            if tid in (t,caller,worker) : continue
            o=max(0,min(y,b)-max(x,a))
            if o>0 and tid!=0: oth+=o
        print('%s %7.2f life %.3f helper %.3f caller %.3f worker %.3f other %.3f'%(name,a-t0,b-a,cpu(t),cpu(caller),cpu(worker),oth))
